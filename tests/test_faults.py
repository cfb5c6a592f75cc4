"""The ``x-llmsim-fault`` header parser (``llmsim/faults.py``): good headers give the plan,
bad ones an error naming the bad fault; and ``llmsim.testing.fault_header``, which builds
them."""

from __future__ import annotations

import pytest
from h2.errors import ErrorCodes

from llmsim.faults import FAULT_NAMES, FaultPlan, FaultSyntaxError, parse_faults
from llmsim.testing import fault_header


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
        ("goaway-after=2,code=enhance_your_calm", FaultPlan(goaway_after=2, goaway_code=ErrorCodes.ENHANCE_YOUR_CALM)),
        ("close-after=1,mode=rst", FaultPlan(close_after=1, close_mode="rst")),
        ("close-after=0, mode = close-notify", FaultPlan(close_after=0, close_mode="close-notify")),
        ("split-at=3, 10", FaultPlan(split_at=(3, 10))),
        ("coalesce=2", FaultPlan(coalesce=2)),
        ("empty-data=3", FaultPlan(empty_data=3)),
        ("padding=0", FaultPlan(padding=0)),
        ("continuation=4", FaultPlan(continuation=4)),
        ("delay-first-token=100", FaultPlan(first_token_delay_ms=100)),
        ("ping-after=0", FaultPlan(ping_after=0)),
        ("settings-after=2", FaultPlan(settings_after=2)),
        ("window-update-storm=1:50", FaultPlan(storm_after=1, storm_count=50)),
        ("bad-event=2: crlf", FaultPlan(bad_event_after=2, bad_event_kind="crlf")),
        ("error-after=1", FaultPlan(error_after=1)),
        ("error-after=1,code=503", FaultPlan(error_after=1, error_status=503)),
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
        ("goaway-after=1,code=NOPE", "'goaway-after=1,code=NOPE'", "unknown HTTP/2 error code 'NOPE'"),
        ("close-after=1,mode=abort", "'close-after=1,mode=abort'", "MODE must be one of fin, rst, close-notify"),
        ("close-after=1,code=CANCEL", "'close-after=1,code=CANCEL'", "expected close-after=N,mode=MODE"),
        ("split-at=5,5", "'split-at=5,5'", "the offsets must increase"),
        ("split-at=0", "'split-at=0'", "OFFSET must be an integer from 1"),
        ("coalesce=1", "'coalesce=1'", "K (events per frame) must be an integer from 2"),
        ("padding=256", "'padding=256'", "from 0 to 255"),
        ("empty-data=0", "'empty-data=0'", "from 1 to 1000"),
        ("continuation=0", "'continuation=0'", "from 1"),
        ("window-update-storm=1", "'window-update-storm=1'", "expected window-update-storm=AFTER_EVENTS:COUNT"),
        ("window-update-storm=1:0", "'window-update-storm=1:0'", "COUNT must be an integer from 1 to 100000"),
        ("bad-event=1:html", "'bad-event=1:html'", "KIND must be one of bad-json, bare-data, crlf, event-line"),
        ("error-after=1,code=200", "'error-after=1,code=200'", "STATUS must be an integer from 400 to 599"),
    ],
)
def test_bad_headers_name_the_fault(header: str, named: str, says: str) -> None:
    with pytest.raises(FaultSyntaxError) as caught:
        parse_faults(header)
    message = str(caught.value)
    assert message.startswith("x-llmsim-fault: ") and named in message and says in message, message


def test_the_plan_names_the_faults_in_the_headers_order() -> None:
    assert parse_faults("stall=1:5; rst-after=2").names == ("stall", "rst-after")
    assert set(FAULT_NAMES) >= {"rst-after", "error-after", "window-update-storm", "trailers"}


@pytest.mark.parametrize(
    ("kwargs", "header"),
    [
        ({"rst_after": 5, "code": "CANCEL"}, "rst-after=5,code=CANCEL"),
        ({"goaway_after": 1, "goaway_code": "PROTOCOL_ERROR"}, "goaway-after=1,code=PROTOCOL_ERROR"),
        ({"frame_size": 3, "stall": (2, 500)}, "frame-size=3; stall=2:500"),
        ({"split_at": [3, 10], "coalesce": 2}, "split-at=3,10; coalesce=2"),
        ({"window_update_storm": (1, 9), "bad_event": (0, "crlf")}, "window-update-storm=1:9; bad-event=0:crlf"),
        ({"error_after": 2, "error_status": 503}, "error-after=2,code=503"),
        ({"trailers": {"x-a": "1", "x-b": "two"}}, "trailers=x-a:1,x-b:two"),
        ({"delay_headers_ms": 0, "delay_first_token_ms": 5}, "delay-headers=0; delay-first-token=5"),
    ],
)
def test_fault_header_builds_the_header(kwargs: dict[str, object], header: str) -> None:
    assert fault_header(**kwargs) == header  # type: ignore[arg-type]
    parse_faults(header)


def test_fault_header_refuses_what_the_server_would() -> None:
    with pytest.raises(ValueError, match="padding=300"):
        fault_header(padding=300)
    with pytest.raises(ValueError, match="unknown or malformed fault ''"):
        fault_header()
