"""FedProto, WiFed, FedCaring and the shared prototype helpers on hand-computed cases,
plus every method's round trip through its own schema, the wire and the real round
engine (in process, tests/inprocess.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mqttfl.algorithms import algorithm_names, get_algorithm
from mqttfl.algorithms.base import Context, Upload
from mqttfl.algorithms.common.prototypes import global_bank, nearest_prototype, prototype_mse
from mqttfl.algorithms.common.weights import flatten_weights
from mqttfl.algorithms.fedcaring import FedCaringParams, FedCaringServer, caring_weights
from mqttfl.algorithms.fedproto import FedProtoClient, FedProtoParams, FedProtoServer
from mqttfl.algorithms.wifed import WiFedClient
from mqttfl.engine.gate import UploadGate
from mqttfl.errors import RejectedUpload, WireError
from mqttfl.wire import Message, encode
from mqttfl.wire.schemas import ClientInfo
from tests.bodies import array, editable, mapping, number
from tests.inprocess import Federation

MY_METHODS = ("fedproto", "fedsap", "fedali", "fedpam", "wifed", "fedcaring")


# --- the shared prototype bank (FedProto / FedSAP Eq. 2) -------------------------------
# Client 0 holds classes 0, 1; client 1 holds classes 0, 2; nobody holds class 3.
PROTOS = np.array([[[1, 0], [0, 2], [0, 0], [0, 0]], [[3, 4], [0, 0], [5, 5], [0, 0]]], np.float32)
MASK = np.array([[True, True, False, False], [True, False, True, False]])


def test_global_bank_is_the_mean_over_the_clients_holding_each_class() -> None:
    bank, available = global_bank(PROTOS, MASK)
    np.testing.assert_allclose(bank, [[2, 2], [0, 2], [5, 5], [0, 0]])  # (1/2)([1,0] + [3,4])
    assert available.tolist() == [True, True, True, False]


def test_global_bank_can_weight_by_sample_counts() -> None:
    counts = np.array([[3, 1, 0, 0], [1, 0, 2, 0]])
    bank, _ = global_bank(PROTOS, MASK, counts)
    np.testing.assert_allclose(bank[0], [1.5, 1.0])  # (3·[1,0] + 1·[3,4]) / 4


def _proto_upload(cid: str, classes: list[int], protos: np.ndarray, counts: list[int]) -> Upload:
    info = ClientInfo(cid, "middle", tuple(classes), sum(counts), (8, 6))
    return Upload(
        cid,
        info,
        {
            "classes": np.array(classes),
            "prototypes": protos.astype(np.float32),
            "counts": np.array(counts),
        },
    )


def test_fedproto_server_broadcasts_the_bank_and_never_weights() -> None:
    ctx = Context(num_classes=4, embed_dim=2, rounds=2, seed=0, params=FedProtoParams())
    down = FedProtoServer(ctx).aggregate(
        1,
        [
            _proto_upload("0", [0, 1], PROTOS[0, :2], [3, 1]),
            _proto_upload("1", [0, 2], PROTOS[1, [0, 2]], [1, 2]),
        ],
    )
    assert set(down.broadcast) == {"prototypes", "available"}
    assert down.personal == {}
    np.testing.assert_allclose(array(down.broadcast, "prototypes")[0], [2, 2])
    assert array(down.broadcast, "available").tolist() == [1, 1, 1, 0]
    weighted = Context(
        num_classes=4,
        embed_dim=2,
        rounds=2,
        seed=0,
        params=FedProtoParams(proto_weighting="samples"),
    )
    down = FedProtoServer(weighted).aggregate(
        1,
        [
            _proto_upload("0", [0, 1], PROTOS[0, :2], [3, 1]),
            _proto_upload("1", [0, 2], PROTOS[1, [0, 2]], [1, 2]),
        ],
    )
    np.testing.assert_allclose(array(down.broadcast, "prototypes")[0], [1.5, 1.0])


def test_prototype_mse_is_torch_mse_over_samples_with_a_global_prototype() -> None:
    z = torch.tensor([[1.0, 2.0], [9.0, 9.0]])
    bank = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    # sample 1's class is unavailable: only ‖[1,2]-[0,0]‖²/2 = 2.5 counts
    loss = prototype_mse(z, bank, torch.tensor([0, 1]), torch.tensor([True, False]))
    assert float(loss) == pytest.approx(2.5)


def test_nearest_prototype_skips_unavailable_classes() -> None:
    bank = torch.tensor([[0.0, 0.0], [10.0, 0.0], [1.0, 0.0]])
    z = torch.tensor([[0.9, 0.0], [7.0, 0.0]])
    assert nearest_prototype(z, bank, torch.tensor([True, True, True])).tolist() == [2, 1]
    assert nearest_prototype(z, bank, torch.tensor([True, True, False])).tolist() == [0, 1]


def test_fedproto_loss_is_ce_plus_lambda_mse() -> None:
    fed = Federation("fedproto", clients=1, proto_lambda=2.0)
    client = fed.clients[0]
    assert isinstance(client, FedProtoClient)
    logits, z, y = torch.tensor([[2.0, 0.0, 0.0, 0.0]]), torch.zeros(1, 8), torch.tensor([0])
    assert float(client.loss(1, {}, logits, z, y)) == pytest.approx(
        float(F.cross_entropy(logits, y))
    )
    client.bank, client.available = torch.ones(4, 8), torch.ones(4, dtype=torch.bool)
    expected = float(F.cross_entropy(logits, y)) + 2.0 * 1.0  # MSE of 0 against 1 is 1
    assert float(client.loss(1, {}, logits, z, y)) == pytest.approx(expected)


def test_prototype_clients_report_head_and_nearest_prototype_inference() -> None:
    fed = Federation("fedproto").run()
    client = fed.clients[0]
    extra = client.extra_metrics(client.shard.x_test, client.shard.y_test)
    assert {
        "head_accuracy",
        "head_f1",
        "head_mae",
        "proto_accuracy",
        "proto_f1",
        "proto_mae",
    } <= set(extra)
    proto = Federation("fedproto", inference="prototype").run().clients[0]
    assert isinstance(proto, FedProtoClient)
    assert proto.bank is not None
    assert proto.available is not None
    proto.model.eval()
    with torch.no_grad():
        z = proto.model.embed(torch.from_numpy(proto.shard.x_test))
    expected = nearest_prototype(z, proto.bank, proto.available).numpy()
    np.testing.assert_array_equal(proto.predict(proto.shard.x_test), expected)


# --- FedCaring ------------------------------------------------------------------------
def test_caring_weights_are_one_at_or_above_the_mean_and_0_3_below() -> None:
    # mean of 0.9, 0.5, 0.7 is 0.7: the client exactly at the mean counts as good
    assert caring_weights({"a": 0.9, "b": 0.5, "c": 0.7}) == {"a": 1.0, "b": 0.3, "c": 1.0}
    # median of 0.9, 0.1, 0.2 is 0.2 (mean 0.4 would demote c)
    assert caring_weights({"a": 0.9, "b": 0.1, "c": 0.2}, threshold="median") == {
        "a": 1.0,
        "b": 0.3,
        "c": 1.0,
    }


def test_caring_aggregation_uses_the_two_weights_within_each_architecture() -> None:
    ctx = Context(num_classes=4, embed_dim=2, rounds=2, seed=0, params=FedCaringParams())

    def up(cid: str, arch: str, value: float, acc: float) -> Upload:
        info = ClientInfo(cid, arch, (0,), 10, (8, 6))
        return Upload(
            cid,
            info,
            {"weights": np.full(2, value, np.float32), "num_samples": 10, "local_accuracy": acc},
        )

    down = FedCaringServer(ctx).aggregate(
        1,
        [
            up("0", "tiny", 1.0, 0.9),
            up("1", "tiny", 4.0, 0.5),
            up("2", "tiny", 2.0, 0.7),
            up("3", "large", 8.0, 0.1),
        ],
    )
    # (1·1 + 0.3·4 + 1·2) / 2.3 = 4.2 / 2.3
    np.testing.assert_allclose(array(down.broadcast, "weights", "tiny"), 4.2 / 2.3, rtol=1e-6)
    np.testing.assert_allclose(array(down.broadcast, "weights", "large"), 8.0)


def test_caring_client_declares_and_sends_its_local_performance() -> None:
    fed = Federation("fedcaring", clients=2, rounds=1).run()
    body = fed.uploads[0].body
    assert set(body) == {"weights", "num_samples", "local_accuracy"}
    assert 0.0 <= number(body, "local_accuracy") <= 1.0
    schema = fed.schemas[0]
    with pytest.raises(WireError, match="missing"):
        schema.validate({k: v for k, v in body.items() if k != "local_accuracy"})
    with pytest.raises(WireError, match="outside"):
        schema.validate({**body, "local_accuracy": 1.5})


# --- WiFed ----------------------------------------------------------------------------
def test_wifed_fine_tunes_a_copy_and_keeps_the_global_model_for_training() -> None:
    fed = Federation("wifed", clients=2, rounds=1).run()  # each client predicted once
    client = fed.clients[0]
    assert isinstance(client, WiFedClient)
    global_weights = array(fed.server.aggregate(1, fed.uploads).broadcast, "weights", "middle")
    np.testing.assert_allclose(flatten_weights(client.model), global_weights, rtol=1e-6)
    tuned = client.personal
    assert tuned is not None
    assert not np.allclose(flatten_weights(tuned), global_weights)
    tuned.eval()
    with torch.no_grad():
        expected = tuned(torch.from_numpy(client.shard.x_test))[0].argmax(dim=1).numpy()
    np.testing.assert_array_equal(client.predict(client.shard.x_test), expected)
    assert client.personal is tuned  # tuned once per round, not once per call


def test_wifed_without_fine_tuning_is_fedavg() -> None:
    client = Federation("wifed", clients=2, rounds=1, finetune_epochs=0).run().clients[0]
    assert isinstance(client, WiFedClient)
    assert client.personal is not None
    np.testing.assert_array_equal(flatten_weights(client.personal), flatten_weights(client.model))


# --- every method, in process ------------------------------------------------------------
@pytest.mark.parametrize("name", MY_METHODS)
def test_each_method_runs_two_rounds_through_its_schema(name: str) -> None:
    arch = "transformer" if name == "fedali" else "middle"
    fed = Federation(name, arch=arch).run()
    assert len(fed.accuracy) == 2


@pytest.mark.parametrize("name", ["fedproto", "fedsap"])
def test_prototype_methods_work_across_architectures(name: str) -> None:
    fed = Federation(name, arch=["tiny", "middle", "large"]).run()
    assert {c.info.arch for c in fed.clients} == {"tiny", "middle", "large"}
    for upload in fed.uploads:
        assert "weights" not in upload.body


def test_parameter_sharing_methods_average_within_architecture_groups() -> None:
    fed = Federation("fedpam", arch=["tiny", "middle", "tiny"]).run()
    down = fed.server.aggregate(3, fed.uploads)
    assert set(mapping(down.broadcast, "weights")) == {"tiny", "middle"}


def test_every_registered_method_name_is_known() -> None:
    assert set(MY_METHODS) <= set(algorithm_names())


# --- permitted payloads ----------------------------------------------------------------
FORBIDDEN: dict[str, dict[str, Any]] = {
    "fedproto": {"weights": np.ones(10, np.float32)},
    "fedsap": {"weights": np.ones(10, np.float32)},
    "fedpam": {"pam": np.eye(8, dtype=np.float32)},
    "fedali": {"global_0": np.ones((64, 32), np.float32)},
    "wifed": {"local_accuracy": 0.5},
    "fedcaring": {"prototypes": np.ones((2, 8), np.float32)},
}


@pytest.mark.parametrize("name", MY_METHODS)
def test_an_upload_outside_the_schema_is_rejected_by_client_and_coordinator(name: str) -> None:
    arch = "transformer" if name == "fedali" else "middle"
    fed = Federation(name, clients=2, rounds=1, arch=arch).run()
    body = {**fed.uploads[0].body, **FORBIDDEN[name]}
    with pytest.raises(WireError, match="not permitted"):  # the client runner's check
        fed.schemas[0].validate(body)
    gate = UploadGate(get_algorithm(name), fed.ctx, "r", max_bytes=10_000_000)
    gate.open_round(2, ["0"], keep=False)
    with pytest.raises(RejectedUpload) as info:
        gate.check(2, "0", encode(Message("upload", "r", 2, "0", body)), fed.clients[0].info)
    assert info.value.reason == "unknown_field"
    clean = encode(Message("upload", "r", 2, "0", editable(fed.uploads[0].body)))
    assert gate.check(2, "0", clean, fed.clients[0].info).client_id == "0"


def test_prototype_uploads_are_tiny_next_to_weights() -> None:
    sizes = {
        name: len(
            encode(
                Message(
                    "upload",
                    "r",
                    1,
                    "0",
                    editable(Federation(name, clients=1, rounds=1).run().uploads[0].body),
                )
            )
        )
        for name in ("fedproto", "fedavg")
    }
    assert sizes["fedproto"] * 10 < sizes["fedavg"]
