"""What a Triton server's answers may be, for the bench's client (trtkv.bench.transport.client): the
model config read in type (a wrong one is one error line naming where it came from and the field),
and every gRPC answer bounded in bytes as the HTTP parser's are (tritonclient sets no receive
limit)."""

from __future__ import annotations

from typing import Any

from trtkv.bench.transport.http1 import LIMITS
from trtkv.core.errors import TrtkvError

# one gRPC message the bench takes from a server: the HTTP parser's body bound (64 MiB)
GRPC_RESPONSE_BYTES = LIMITS.body_bytes
# what the model config may say: Triton's max_batch_size is an int32; inputs, a few per model
INT32_MAX = 2**31 - 1


def grpc_channel_args(max_receive_bytes: int = GRPC_RESPONSE_BYTES) -> list[tuple[str, int]]:
    """tritonclient's own channel options (its keep-alive defaults, requests up to INT32_MAX) with
    the receive limit bounded: a bigger answer fails its request (RESOURCE_EXHAUSTED)."""
    from tritonclient.grpc import KeepAliveOptions

    keep = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", INT32_MAX),
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.keepalive_time_ms", keep.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keep.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keep.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keep.http2_max_pings_without_data),
    ]


def too_big(error: str) -> str:
    """A gRPC error text, said plainly when it is the receive bound."""
    if "larger than max" in error or "RESOURCE_EXHAUSTED" in error:
        return (
            f"a response over the client's {GRPC_RESPONSE_BYTES >> 20} MiB bound "
            f"(grpc.max_receive_message_length, as HTTP's): {error}"
        )
    return error


def _bad(source: str, field: str, value: Any, expected: str) -> TrtkvError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return TrtkvError(
        f"the model config from {source}: {field} is {shown} ({type(value).__name__}), expected "
        f"{expected}. Next: check the model's config.pbtxt on that server, or --url/--model."
    )


def model_config(config: Any, source: str) -> tuple[int, dict[str, str]]:
    """(max_batch_size, input name -> datatype without TYPE_) from a model config as JSON; a
    TrtkvError naming `source` and the field for anything of the wrong type or range."""
    if not isinstance(config, dict):
        raise _bad(source, "the config", config, "a JSON object")
    batch = config.get("max_batch_size", 0)
    if type(batch) is not int or not 0 <= batch <= INT32_MAX:
        raise _bad(source, "max_batch_size", batch, f"an integer from 0 to {INT32_MAX}")
    items = config.get("input", [])
    if not isinstance(items, list):
        raise _bad(source, "input", items, "a list of inputs")
    inputs: dict[str, str] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _bad(source, f"input[{i}]", item, "an object with name and data_type")
        name, dtype = item.get("name"), item.get("data_type", "")
        if not isinstance(name, str) or not name:
            raise _bad(source, f"input[{i}].name", name, "a non-empty string")
        if not isinstance(dtype, str):
            raise _bad(source, f"input[{i}].data_type", dtype, "a string such as TYPE_STRING")
        inputs[name] = dtype.replace("TYPE_", "")
    return batch, inputs
