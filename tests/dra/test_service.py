"""L2: NodePrepareResources / NodeUnprepareResources over the real DRA socket, through
v1 and v1beta1 stubs as the kubelet calls them, against a recording fake preparer."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_share.agent.dra.ports import ClaimRef, PreparedDevice, PrepareResult
from gpu_share.dra import service
from gpu_share.dra.guard import MAX_REQUEST_BYTES, MAX_STATUS_MESSAGE
from gpu_share.dra.proto import dra_v1_pb2 as v1
from gpu_share.dra.server import DraPluginServer
from tests.dra.conftest import DRIVER, FakePreparer, Kubelet

VERSION = pytest.mark.parametrize("version", ["v1", "v1beta1"])
UID_A = "0b6c2a9e-5f1d-4c1e-9a57-3f7e2d1c0a01"
UID_B = "7d3e1f20-8a4b-4b6c-a0d9-1e2f3a4b5c02"


def _invalid(err: grpc.RpcError, *must_say: str) -> str:
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err
    details: str = err.details() or ""
    assert len(details) <= MAX_STATUS_MESSAGE
    for text in must_say:
        assert text in details, details
    return details


@VERSION
def test_prepare_passes_claims_through_and_answers_devices(
    version: str, plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    claims = [("team-a", "gpu-share-main", UID_A), ("team-b", "gpu-share-side.x", UID_B)]
    response = kubelet.prepare(version, plugin.dra_socket, claims)
    assert preparer.prepared == [
        [ClaimRef(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
    ]
    assert sorted(response.claims) == sorted([UID_A, UID_B])
    entry = response.claims[UID_A]
    assert entry.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in entry.devices] == [
        (["slice"], "node-a", "gpu-0", [f"{DRIVER}/claim={UID_A}-gpu-0"])
    ]


@VERSION
def test_unprepare_passes_claims_through(
    version: str, plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    preparer.errors[UID_B] = "still in use"
    response = kubelet.unprepare(
        version, plugin.dra_socket, [("team-a", "c", UID_A), ("team-b", "d", UID_B)]
    )
    assert preparer.unprepared == [
        [ClaimRef("team-a", "c", UID_A), ClaimRef("team-b", "d", UID_B)]
    ]
    assert response.claims[UID_A].error == ""
    assert response.claims[UID_B].error == "still in use"


def test_unprepare_with_uid_and_name_only(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    response = kubelet.unprepare("v1", plugin.dra_socket, [("", "c", UID_A), ("", "", UID_B)])
    assert preparer.unprepared == [[ClaimRef("", "c", UID_A), ClaimRef("", "", UID_B)]]
    assert set(response.claims) == {UID_A, UID_B}


@VERSION
def test_per_claim_error_is_only_that_claims(
    version: str, plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    preparer.errors[UID_B] = "unknown opaque config kind Foo"
    response = kubelet.prepare(version, plugin.dra_socket, [("a", "x", UID_A), ("a", "y", UID_B)])
    assert response.claims[UID_A].error == "" and len(response.claims[UID_A].devices) == 1
    assert response.claims[UID_B].error == "unknown opaque config kind Foo"
    assert len(response.claims[UID_B].devices) == 0


@VERSION
def test_preparer_raising_is_a_per_claim_error(
    version: str, plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    preparer.raise_with = RuntimeError("checkpoint unwritable " + "z" * 10_000)
    claims = [("a", "x", UID_A), ("a", "y", UID_B)]
    prepared = kubelet.prepare(version, plugin.dra_socket, claims)
    unprepared = kubelet.unprepare(version, plugin.dra_socket, claims)
    for response in (prepared, unprepared):
        assert set(response.claims) == {UID_A, UID_B}
        for entry in response.claims.values():
            assert "RuntimeError: checkpoint unwritable" in entry.error
            assert len(entry.error) <= MAX_STATUS_MESSAGE
    # The server survived: the next call is served.
    preparer.raise_with = None
    assert kubelet.prepare(version, plugin.dra_socket, claims).claims[UID_A].error == ""


def test_claim_the_preparer_left_out_gets_an_error(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    preparer.omit.add(UID_B)
    claims = [("a", "x", UID_A), ("a", "y", UID_B)]
    response = kubelet.prepare("v1", plugin.dra_socket, claims)
    assert response.claims[UID_A].error == ""
    assert "no result" in response.claims[UID_B].error
    response = kubelet.unprepare("v1", plugin.dra_socket, claims)
    assert response.claims[UID_A].error == ""
    assert "no result" in response.claims[UID_B].error


def test_error_wins_over_devices(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    device = PreparedDevice(("slice",), "node-a", "gpu-0", ("x/y=z",))
    preparer.result_for = lambda ref: PrepareResult(devices=(device,), error="half done")
    entry = kubelet.prepare("v1", plugin.dra_socket, [("a", "x", UID_A)]).claims[UID_A]
    assert entry.error == "half done" and len(entry.devices) == 0


def test_answer_too_large_becomes_per_claim_errors(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    ids = tuple(f"{DRIVER}/claim={i:0>200}" for i in range(20_000))  # ~4.4 MB
    preparer.result_for = lambda ref: PrepareResult(
        devices=(PreparedDevice(("slice",), "node-a", "gpu-0", ids),)
    )
    response = kubelet.prepare("v1", plugin.dra_socket, [("a", "x", UID_A)])
    assert "do not fit in one answer" in response.claims[UID_A].error
    assert len(response.claims[UID_A].devices) == 0


def test_empty_request_does_not_call_the_preparer(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    assert len(kubelet.prepare("v1", plugin.dra_socket, []).claims) == 0
    assert len(kubelet.unprepare("v1beta1", plugin.dra_socket, []).claims) == 0
    assert preparer.prepared == [] and preparer.unprepared == []


def test_same_claim_twice_is_passed_once(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    response = kubelet.prepare("v1", plugin.dra_socket, [("a", "x", UID_A)] * 2)
    assert preparer.prepared == [[ClaimRef("a", "x", UID_A)]]
    assert list(response.claims) == [UID_A]


def _ok(i: int = 0) -> tuple[str, str, str]:
    return ("ns", f"claim-{i}", f"uid-{i}")


# (case, claims, what the message must say). Each is valid but for one defect, so
# without its guard the call would reach the preparer and answer OK.
GUARDS: list[tuple[str, list[tuple[str, str, str]], str]] = [
    ("empty uid", [_ok(), ("ns", "c", "")], "claims[1] has no uid"),
    ("uid too long", [("ns", "c", "a" * 129)], "claims[0].uid has 129 characters"),
    ("uid with a path", [("ns", "c", "../../etc/x")], "claims[0].uid '../../etc/x' is not"),
    ("uid with a slash", [("ns", "c", "a/b")], "is not a valid uid"),
    ("uid ending in a dash", [("ns", "c", "abc-")], "is not a valid uid"),
    ("uid with a non-ASCII digit", [("ns", "c", "a\u0663b")], "is not a valid uid"),
    ("empty namespace", [("", "c", "u")], "claims[0] has no namespace"),
    ("namespace too long", [("n" * 64, "c", "u")], "claims[0].namespace has 64 characters"),
    ("namespace not a label", [("Team_A", "c", "u")], "is not a valid namespace"),
    ("empty name", [("ns", "", "u")], "claims[0] has no name"),
    ("name too long", [("ns", "n" * 254, "u")], "claims[0].name has 254 characters"),
    ("name not a subdomain", [("ns", "a/../b", "u")], "is not a valid name"),
    ("too many claims", [_ok(i) for i in range(service.MAX_CLAIMS + 1)], "257 claims"),
    ("uid named twice differently", [("ns", "a", "u"), ("ns", "b", "u")], "named twice"),
]


@pytest.mark.parametrize(
    ("claims", "says"), [(c, s) for _, c, s in GUARDS], ids=[g[0] for g in GUARDS]
)
@VERSION
def test_malformed_prepare_is_invalid_argument(
    version: str,
    claims: list[tuple[str, str, str]],
    says: str,
    plugin: DraPluginServer,
    kubelet: Kubelet,
    preparer: FakePreparer,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        kubelet.prepare(version, plugin.dra_socket, claims)
    _invalid(err.value, "NodePrepareResources", says)
    assert preparer.prepared == []


UNPREPARE_GUARDS = [g for g in GUARDS if g[0] not in {"empty namespace", "empty name"}]


@pytest.mark.parametrize(
    ("claims", "says"), [(c, s) for _, c, s in UNPREPARE_GUARDS],
    ids=[g[0] for g in UNPREPARE_GUARDS],
)
def test_malformed_unprepare_is_invalid_argument(
    claims: list[tuple[str, str, str]],
    says: str,
    plugin: DraPluginServer,
    kubelet: Kubelet,
    preparer: FakePreparer,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        kubelet.unprepare("v1beta1", plugin.dra_socket, claims)
    _invalid(err.value, "NodeUnprepareResources", says)
    assert preparer.unprepared == []


def test_long_input_is_never_echoed(plugin: DraPluginServer, kubelet: Kubelet) -> None:
    # Within the length bound but not a name: the message quotes a short prefix only.
    with pytest.raises(grpc.RpcError) as err:
        kubelet.prepare("v1", plugin.dra_socket, [("ns", "q" * 200 + "/", "u")])
    details = _invalid(err.value, "is not a valid name", "(201 characters)")
    assert "q" * 64 in details and "q" * 65 not in details


def _with_unknown_field(size: int) -> bytes:
    # A valid request plus an unknown field 15 of ``size`` bytes (decoders keep it).
    valid = v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace="ns", name="c", uid="u")]
    ).SerializeToString()
    varint = bytearray()
    n = size
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return valid + b"\x7a" + bytes(varint) + b"x" * size


@VERSION
def test_request_too_large_is_invalid_argument(
    version: str, plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    # Only the size is wrong: the same request with a small unknown field is served.
    v1.NodePrepareResourcesResponse.FromString(
        kubelet.raw(plugin.dra_socket, "NodePrepareResources", _with_unknown_field(10), version)
    )
    assert len(preparer.prepared) == 1
    with pytest.raises(grpc.RpcError) as err:
        kubelet.raw(
            plugin.dra_socket, "NodePrepareResources",
            _with_unknown_field(MAX_REQUEST_BYTES), version,
        )
    _invalid(err.value, "bytes, above the limit")
    assert len(preparer.prepared) == 1


def test_request_over_the_transport_limit_is_resource_exhausted(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        kubelet.raw(plugin.dra_socket, "NodePrepareResources", _with_unknown_field(5 << 20))
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert preparer.prepared == []


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff\xff",  # not protobuf at all
        b"\x0a\x05\x12\x03\xff\xfe\xfd",  # claims[0].uid is not UTF-8
        b"\x0a\x10",  # truncated
    ],
    ids=["garbage", "invalid-utf8", "truncated"],
)
@pytest.mark.parametrize("method", ["NodePrepareResources", "NodeUnprepareResources"])
def test_undecodable_request_is_invalid_argument_not_internal(
    data: bytes, method: str, plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        kubelet.raw(plugin.dra_socket, method, data)
    _invalid(err.value, "is not a valid protobuf message")
    assert preparer.prepared == [] and preparer.unprepared == []


def test_direct_conversion_keeps_order_and_fields() -> None:
    claims = [v1.Claim(namespace="n1", name="a", uid="u1"), v1.Claim(namespace="n2", name="b",
                                                                       uid="u2")]
    refs: Any = service.claims_of(claims, need_names=True)
    assert refs == [ClaimRef("n1", "a", "u1"), ClaimRef("n2", "b", "u2")]
    # Dots inside a uid are fine, as the agent takes them.
    assert service.claims_of([v1.Claim(namespace="n", name="a", uid="a.b")], need_names=True)


_REQUESTS = st.one_of(
    st.binary(max_size=512),
    st.lists(
        st.tuples(st.text(max_size=70), st.text(max_size=70), st.text(max_size=140)),
        max_size=8,
    ).map(
        lambda cs: v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace=a, name=b, uid=c) for a, b, c in cs]
        ).SerializeToString()
    ),
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_REQUESTS, method=st.sampled_from(["NodePrepareResources", "NodeUnprepareResources"]))
def test_any_bytes_answer_ok_or_invalid_argument(
    data: bytes, method: str, plugin: DraPluginServer, kubelet: Kubelet
) -> None:
    try:
        kubelet.raw(plugin.dra_socket, method, data)
    except grpc.RpcError as err:
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err
        assert len(err.details() or "") <= MAX_STATUS_MESSAGE
