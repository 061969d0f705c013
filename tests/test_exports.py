import mqttfl


def test_public_surface_is_sorted_and_importable() -> None:
    assert mqttfl.__all__ == sorted(mqttfl.__all__)
    for name in mqttfl.__all__:
        assert getattr(mqttfl, name) is not None
