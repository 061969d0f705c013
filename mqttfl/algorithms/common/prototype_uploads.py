"""What prototype methods upload: the schema, the class statistics behind it (exact, or
noised with [privacy] on) and the server's stacking of a round's uploads."""

from __future__ import annotations

from typing import NotRequired, TypedDict, cast

import numpy as np

from mqttfl.algorithms.base import ClientSide, Context, Upload
from mqttfl.privacy.mechanism import private_class_prototypes
from mqttfl.training.loops import class_prototypes
from mqttfl.wire.schemas import ArrayField, PayloadSchema


class PrototypeUpload(TypedDict):
    """The upload of a prototype method (:func:`prototype_schema`): the classes it holds,
    one prototype per class and, where the method weights by them, their sample counts."""

    classes: np.ndarray  # (k,) int64
    prototypes: np.ndarray  # (k, embed_dim) float32
    counts: NotRequired[np.ndarray]  # (k,) int64


def uploaded_prototypes(upload: Upload) -> PrototypeUpload:
    """``upload``'s body, which its schema checked, as the prototype upload it is."""
    return cast("PrototypeUpload", upload.body)


def class_statistics(
    client: ClientSide, embeddings: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``client``'s class prototypes of ``embeddings``: exact (FedAPA Eq. 4), or with its
    run's [privacy] on, :func:`~mqttfl.privacy.mechanism.private_class_prototypes`."""
    privacy = client.ctx.privacy
    if privacy is None:
        return class_prototypes(embeddings, y)
    return private_class_prototypes(
        embeddings,
        y,
        num_classes=client.ctx.num_classes,
        clip=privacy.clip,
        noise_multiplier=privacy.noise_multiplier,
        rng=client.noise(),
        count_threshold=privacy.count_threshold,
    )


def prototype_schema(ctx: Context, *, counts: bool = False) -> PayloadSchema:
    """Per-class prototypes, nothing else; per-class sample counts too with ``counts``
    (for a server that weights by them, e.g. FedProto's ``proto_weighting="samples"``)."""
    fields = {
        "classes": ArrayField("int64", ("k",), 0, ctx.num_classes - 1, unique=True),
        "prototypes": ArrayField("float32", ("k", ctx.embed_dim)),
    }
    if counts:
        fields["counts"] = ArrayField("int64", ("k",), 1, None)
    return PayloadSchema(fields, dims={"k": (1, ctx.num_classes)})


def stack_uploads(
    uploads: list[Upload], num_classes: int, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    protos = np.zeros((len(uploads), num_classes, dim), np.float32)
    mask = np.zeros((len(uploads), num_classes), bool)
    for row, upload in enumerate(uploads):
        body = uploaded_prototypes(upload)
        classes = body["classes"]
        protos[row, classes] = body["prototypes"]
        mask[row, classes] = True
    return protos, mask
