"""The ``x-llmsim-fault`` header parser: good headers give the plan, bad ones an error
naming the bad fault."""

from __future__ import annotations

import pytest
from h2.errors import ErrorCodes

from llmsim.protocol.faults import FaultPlan, FaultSyntaxError, parse_faults


@pytest.mark.parametrize(
    ("header", "plan"),
    [
        ("rst-after=5", FaultPlan(rst_after=5)),
        ("rst-after=0", FaultPlan(rst_after=0)),
        ("rst-after=5,code=INTERNAL_ERROR", FaultPlan(rst_after=5, rst_code=ErrorCodes.INTERNAL_ERROR)),
        ("rst-after=1, code=refused_stream", FaultPlan(rst_after=1, rst_code=ErrorCodes.REFUSED_STREAM)),
        ("goaway-after=3", FaultPlan(goaway_after=3)),
        ("close-after=2", FaultPlan(close_after=2)),
        ("frame-size=1", FaultPlan(frame_size=1)),
        ("delay-headers=250", FaultPlan(delay_headers_ms=250)),
        ("stall=2:1500", FaultPlan(stall_after=2, stall_ms=1500)),
        ("trailers=grpc-status:0", FaultPlan(trailers=((b"grpc-status", b"0"),))),
        ("trailers=X-A: 1 ,x-b:two words", FaultPlan(trailers=((b"x-a", b"1"), (b"x-b", b"two words")))),
        (
            " frame-size = 10 ; stall=1:5;rst-after=4 ",
            FaultPlan(frame_size=10, stall_after=1, stall_ms=5, rst_after=4),
        ),
    ],
)
def test_good_headers(header: str, plan: FaultPlan) -> None:
    assert parse_faults(header) == plan


def test_the_default_reset_code_is_cancel() -> None:
    assert parse_faults("rst-after=1").rst_code == ErrorCodes.CANCEL == 0x8


@pytest.mark.parametrize(
    ("header", "named", "says"),
    [
        ("", "''", "unknown or malformed fault"),
        ("rst-after=1;", "''", "unknown or malformed fault"),
        ("reset=1", "'reset=1'", "known faults: rst-after, goaway-after"),
        ("rst-after", "'rst-after'", "unknown or malformed fault"),
        ("rst-after=-1", "'rst-after=-1'", "must be an integer from 0"),
        ("rst-after=x", "'rst-after=x'", "must be an integer"),
        ("rst-after=1,code=NOPE", "'rst-after=1,code=NOPE'", "unknown HTTP/2 error code 'NOPE'"),
        ("rst-after=1,kode=CANCEL", "'rst-after=1,kode=CANCEL'", "expected rst-after=N,code=NAME"),
        ("goaway-after=1.5", "'goaway-after=1.5'", "must be an integer"),
        ("close-after=99999999999", "'close-after=99999999999'", "must be an integer"),
        ("frame-size=0", "'frame-size=0'", "from 1 to 16777215"),
        ("delay-headers=3600001", "'delay-headers=3600001'", "from 0 to 3600000"),
        ("stall=3", "'stall=3'", "expected stall=AFTER_EVENTS:MS"),
        ("stall=a:3", "'stall=a:3'", "AFTER_EVENTS must be an integer"),
        ("trailers=novalue", "'trailers=novalue'", "expected trailers=name:value"),
        ("trailers=bad name:1", "'trailers=bad name:1'", "expected trailers=name:value"),
        ("trailers=content-length:3", "'trailers=content-length:3'", "not allowed in trailers"),
        ("rst-after=1; rst-after=2", "'rst-after'", "is given twice"),
    ],
)
def test_bad_headers_name_the_fault(header: str, named: str, says: str) -> None:
    with pytest.raises(FaultSyntaxError) as caught:
        parse_faults(header)
    message = str(caught.value)
    assert message.startswith("x-llmsim-fault: ") and named in message and says in message, message
