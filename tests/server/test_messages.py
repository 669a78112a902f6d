"""Every inter-process message survives its pipe's encoder and decoder; a bad frame fails clearly."""

from __future__ import annotations

import msgspec
import pytest
from skiff.engine.stats import EngineStats
from skiff.outputs import RequestTiming, StepOutput
from skiff.params import SamplingParams
from skiff.server import messages as m
from skiff.server import protocol as P

DECODE = m.DecodeOptions(stop=["\n\n"], skip_special_tokens=False, logprobs=True)
SAMPLING = SamplingParams(temperature=0.0, seed=7, stop_token_ids=[2], logprobs=True, top_logprobs=2)
OUTPUT = StepOutput("r-0", [5, 2], [-0.5, -0.1], [{5: -0.5, 6: -1.5}, {2: -0.1}], "stop", 2, 3, 1, 2)
CHUNK = m.DetokenizedChunk(
    "r-0", "hi", 2, [m.TokenLogprob("hi", -0.5, [("hi", -0.5), ("ho", -1.5)])], "stop", 2, 3, 1, 2, None
)
TIMING = RequestTiming("r-0", 1_700_000_000_000_000_000, 1_700_000_000_001_000_000, 1_700_000_000_002_000_000)
STATS = EngineStats(
    num_running=1,
    num_queued=0,
    total_pages=64,
    free_pages=40,
    cached_pages=8,
    used_pages=16,
    token_usage=0.375,
    cache_hit_tokens=32,
    prompt_tokens=128,
    generation_tokens=99,
    num_preemptions=0,
    page_size=16,
)

# one sample of every message, with the union of the pipe that carries it
SAMPLES: list[tuple[m.Message, object]] = [
    (m.TokenizeRequest(["r-0"], m.TextPrompt("hello"), [SAMPLING], None, DECODE), m.ToTokenizer),
    (m.TokenizeRequest(["r-0", "r-1"], m.TokenIdsPrompt([1, 2]), [SAMPLING] * 2, 16, DECODE), m.ToTokenizer),
    (
        m.TokenizeRequest(
            ["r-0"], m.ChatPrompt([{"role": "user", "content": "hi"}], {"x": 1}), [SAMPLING], 4, DECODE
        ),
        m.ToTokenizer,
    ),
    (m.Shutdown(), m.ToTokenizer),
    (m.TokenizedRequest("r-0", [1, 2, 3], SAMPLING, 8, DECODE), m.ToScheduler),
    (m.TokenizedRequest("r-0", [1, 2, 3], SAMPLING, None, DECODE, 1, TIMING.queued), m.ToScheduler),
    (m.AbortRequest("r-0"), m.ToScheduler),
    (m.IntegrityCheck(3), m.ToScheduler),
    (m.Shutdown(), m.ToScheduler),
    (m.DecodeRegistration("r-0", DECODE), m.ToDetokenizer),
    (m.StepTokens([OUTPUT, StepOutput("r-1", [9])]), m.ToDetokenizer),
    (m.StepTokens([OUTPUT], [TIMING]), m.ToDetokenizer),
    (m.Shutdown(), m.ToDetokenizer),
    (m.DetokenizedChunks([CHUNK]), m.ToApi),
    (m.DetokenizedChunks([msgspec.structs.replace(CHUNK, timing=TIMING), CHUNK]), m.ToApi),
    (m.RequestFailed("r-0", 400, "the prompt is empty"), m.ToApi),
    (m.TokenizerReady("tokenizer-0", [9906], 49152, "qwen25", None), m.ToApi),
    (m.DetokenizerReady(), m.ToApi),
    (m.EngineReady(8192, [0, 2], [123], STATS), m.ToApi),
    (m.ChildFailed("scheduler", "RuntimeError: boom"), m.ToApi),
    (m.SchedulerStats(STATS, 12.5), m.ToApi),
    (m.IntegrityReport(3, False, "page accounting mismatch", STATS, 0), m.ToApi),
]


def _all_message_types() -> set[type]:
    seen, todo = set(), [m.Message]
    while todo:
        for sub in todo.pop().__subclasses__():
            seen.add(sub)
            todo.append(sub)
    return seen


def test_every_message_type_has_a_sample() -> None:
    assert {type(msg) for msg, _ in SAMPLES} == _all_message_types()


@pytest.mark.parametrize(("msg", "accepts"), SAMPLES, ids=[type(s[0]).__name__ for s in SAMPLES])
def test_round_trip(msg: m.Message, accepts: object) -> None:
    decoded = P.Decoder("test", accepts)(P.encode(msg))
    assert type(decoded) is type(msg)
    assert decoded == msg


def test_merged_chunks_keep_the_first_ones_timing() -> None:
    first = m.DetokenizedChunk("r-0", "Hel", 1, None, None, None, 3, 1, 1, None, TIMING)
    later = m.DetokenizedChunk("r-0", "lo", 2, None, "length", None, 3, 1, 3, None)
    merged = first.then(later)
    assert (merged.text, merged.n_tokens, merged.completion_tokens) == ("Hello", 3, 3)
    assert (merged.finish_reason, merged.timing) == ("length", TIMING)
    assert later.then(first).timing == TIMING


def test_a_message_on_the_wrong_pipe_is_rejected() -> None:
    with pytest.raises(P.ProtocolError, match="bad message on the scheduler pipe"):
        P.Decoder("scheduler", m.ToScheduler)(P.encode(m.DetokenizerReady()))


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        b"not msgpack at all",
        msgspec.msgpack.encode({"t": "add", "rid": "x"}),
        b"\x92\xa4Nope\x01",
    ],
    ids=["empty", "reserved byte", "garbage", "an old dict message", "unknown tag"],
)
def test_a_garbled_frame_is_rejected(frame: bytes) -> None:
    with pytest.raises(P.ProtocolError, match="bad message on the api pipe"):
        P.Decoder("api", m.ToApi)(frame)


def test_invalid_sampling_params_do_not_decode() -> None:
    frame = msgspec.msgpack.encode(["TokenizedRequest", "r-0", [1], {"temperature": -1.0}, None, {}])
    with pytest.raises(P.ProtocolError, match="temperature must be in"):
        P.Decoder("scheduler", m.ToScheduler)(frame)


def test_inbox_drops_a_bad_frame_and_keeps_the_rest() -> None:
    import zmq

    ctx = zmq.Context()
    try:
        addr = "inproc://test-inbox"
        inbox = P.Inbox(P.pull_socket(ctx, addr), P.Decoder("scheduler", m.ToScheduler))
        out = P.outbox(ctx, addr)
        out.sock.send(b"garbage")
        out.send(m.AbortRequest("r-0"))
        out.send(m.Shutdown())
        got: list[m.Message] = []
        while len(got) < 2:
            got += inbox.drain(1000)
        assert got == [m.AbortRequest("r-0"), m.Shutdown()]
    finally:
        ctx.destroy(linger=0)


def test_endpoints_live_in_one_directory() -> None:
    ep = P.Endpoints.under("/tmp/skiff-x")
    assert (ep.api, ep.tokenizer, ep.scheduler, ep.detokenizer) == (
        ("ipc:///tmp/skiff-x/api",),
        ("ipc:///tmp/skiff-x/tokenizer",),
        "ipc:///tmp/skiff-x/scheduler",
        ("ipc:///tmp/skiff-x/detokenizer",),
    )
    many = P.Endpoints.under("/tmp/skiff-x", api_workers=2, detokenizers=3)
    assert many.api == ("ipc:///tmp/skiff-x/api", "ipc:///tmp/skiff-x/api-1")
    assert many.tokenizer == ("ipc:///tmp/skiff-x/tokenizer", "ipc:///tmp/skiff-x/tokenizer-1")
    assert many.detokenizer[1:] == ("ipc:///tmp/skiff-x/detokenizer-1", "ipc:///tmp/skiff-x/detokenizer-2")
