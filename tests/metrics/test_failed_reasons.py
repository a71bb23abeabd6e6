"""Why requests failed, on the report and in the JSON (`failed_reasons`): one count per cause,
whatever request and length it hit, for the simulator's, the engine's and a server's failures."""

from __future__ import annotations

from kvlab.cli.report import format_report
from kvlab.metrics import summarize
from kvlab.metrics.failures import failure_reason
from kvlab.policies import RequestStatus


def test_the_schedulers_messages_count_as_one_reason_each(make_request, make_failed,
                                                          make_result):
    too_long = [make_failed(i) for i in range(3)]
    for i, request in enumerate(too_long):
        request.error = (f"request {i} needs {5000 + i} tokens ({4000 + i} prompt + 1000 "
                         "output), more than max_model_len 4096")
    too_big = make_failed(9)
    too_big.error = ("request 9 needs 300 KV pages but the cache has only 256 (one page per "
                     "16 tokens of its 4800)")
    aborted = make_request(10, status=RequestStatus.FINISHED_ABORTED)
    summary = summarize(make_result([make_request(5), *too_long, too_big, aborted]))
    assert summary["failed"] == 5
    assert summary["failed_reasons"] == {
        "needs more tokens than max_model_len 4096": 3,
        "aborted": 1,
        "needs more KV pages than the cache's 256": 1,
    }
    report = format_report(summary)
    assert "  3 needs more tokens than max_model_len 4096" in report
    assert report.index("Failed requests:") < report.index("  3 needs more tokens")


def test_a_run_without_failures_has_no_reasons(make_request, make_result):
    summary = summarize(make_result([make_request(0)]))
    assert summary["failed_reasons"] == {}
    assert "needs" not in format_report(summary)


def test_server_messages_keep_their_first_line_and_unfinished_requests_say_so():
    assert failure_reason("finished_error", "HTTP 400: too long\ntrace") == "HTTP 400: too long"
    vllm = ("HTTP 400: This model's maximum context length is 2048 tokens. However, your "
            "prompt contains {} input tokens, which exceeds this limit.")
    assert {failure_reason("finished_error", vllm.format(n)) for n in (2221, 4085)} == {
        "HTTP 400: This model's maximum context length is 2048 tokens"}
    assert failure_reason("running", None) == "did not finish (running)"
