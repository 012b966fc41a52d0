"""The recording file: what it holds, its size, and a clear error for every damaged or foreign file."""
from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from explorer.core.recording import SCHEMA_VERSION, Recording, RecordingError, RecordingWriter, save_recording

pytestmark = pytest.mark.slow  # the tiny model runs the workload (a few seconds)


def test_the_workload_exercises_hits_chunks_preemption_and_an_abort(kvscope_run):
    s, rec, _ = kvscope_run
    summary = s.metrics["summary"]
    assert summary["prefix_cache_hits"] > 0 and summary["num_preemptions"] > 0
    chunks = [x for e in s.history if e.record for x in e.record["scheduled"] if x["is_prefill"] and x["chunk_index"]]
    assert chunks, "no prompt was chunked"
    assert [r.finish_reason for r in rec.requests].count("abort") == 1
    assert rec.source.pristine and rec.source.clock == "engine" and rec.source.first_step == 0
    assert len(rec.steps) == len(s.history) - 1


def test_arrivals_are_the_steps_that_first_saw_each_request(kvscope_run):
    s, rec, _ = kvscope_run
    arrival = {r.request_id: r.arrival_step for r in rec.requests}
    # Added before any step, after step 3, after step 5, after step 9 (with the abort), after step 14.
    assert [arrival[str(i)] for i in range(7)] == [1, 1, 1, 4, 6, 10, 15]
    victim = rec.request("4")
    assert victim.aborted_before_step == 10 and not victim.aborted_during_step and not victim.ends_by_itself
    assert [r.arrival_seq for r in sorted(rec.requests, key=lambda r: int(r.request_id))] == list(range(7))
    finished = {r["request_id"]: r for r in s.current.snapshot["queues"]["finished"]}
    for r in rec.requests:
        assert r.output_token_ids == finished[r.request_id]["output_token_ids"]
        assert r.prompt_token_ids == finished[r.request_id]["prompt_token_ids"]


def test_settings_and_round_trip(kvscope_run, tmp_path):
    _, rec, path = kvscope_run
    s = rec.settings
    sizes = (s.block_size, s.num_blocks, s.max_num_batched_tokens, s.max_num_seqs, s.max_model_len)
    assert sizes == (16, 20, 48, 4, 256)
    assert s.policy == "fcfs" and s.prefix_caching_hash_algo == "sha256" and s.long_prefill_token_threshold == 0
    plain = rec.save(tmp_path / "copy.kvrec")
    again = Recording.load(plain)
    assert again == rec
    assert gzip.open(path).readline().startswith(b'{"format":"kvscope-recording"')


def test_size_grows_with_requests_not_steps(kvscope_run, tmp_path):
    _, rec, _ = kvscope_run
    base = len(rec.save(tmp_path / "a.kvrec").read_bytes())
    more = dataclasses.replace(rec, steps=dataclasses.replace(rec.steps))
    for col in more.steps.COLUMNS:   # ten times the steps, the same requests
        setattr(more.steps, col, getattr(rec.steps, col) * 10)
    more.steps.step = list(range(1, 10 * len(rec.steps) + 1))
    grown = len(more.save(tmp_path / "b.kvrec").read_bytes())
    per_step = (grown - base) / (9 * len(rec.steps))
    tokens = sum(len(r.prompt_token_ids) + len(r.output_token_ids) for r in rec.requests)
    assert per_step < 100, per_step            # a few numbers and a digest per step
    assert base > 4 * tokens                   # the bulk is the requests' tokens


def test_the_writer_is_incremental_and_bounded(kvscope_run, tmp_path):
    s, rec, _ = kvscope_run
    path = tmp_path / "inc.kvrec"
    writer = RecordingWriter(path)
    for i, e in enumerate(s.history):
        writer.add(e)
        if i == 20:   # it holds the requests in flight, no more: the finished ones are on disk
            q = e.snapshot["queues"]
            assert set(writer._open) == {r["request_id"] for r in q["running"] + q["waiting"]}
            assert writer._written == {r["request_id"] for r in q["finished"]}
    writer.close()

    def same(p):   # rec, with the creation time of the file at p
        created = Recording.load(p).source.created
        return dataclasses.replace(rec, source=dataclasses.replace(rec.source, created=created))

    assert Recording.load(path) == same(path)
    followed = RecordingWriter(tmp_path / "followed.kvrec")   # what a live session's follower writes
    unsubscribe = followed.follow(s)
    unsubscribe()
    assert Recording.load(followed.close()) == same(followed.path)


@pytest.mark.parametrize("damage, says", [
    (lambda t: t[: t.rindex('{"kind":"end"')], "ends without its end line"),
    (lambda t: t[: len(t) // 2], "damaged \\(not JSON"),
    (lambda t: "".join(ln for ln in t.splitlines(keepends=True) if '"request_id":"2"' not in ln), "lines are missing"),
    (lambda t: t.replace('"kind":"request"', '"kind":"requests"', 1), "unknown line kind 'requests'"),
    (lambda t: t.replace(',"prompt_token_ids":[', ',"prompt_token_ids":["x",', 1), "prompt_token_ids must be a list"),
    (lambda t: t.replace('"block_size":16', '"block_size":0', 1), "settings.block_size must be >= 1"),
    (lambda t: t.replace(f'"schema":{SCHEMA_VERSION}', '"schema":99', 1), "schema 99"),
    (lambda t: '{"hello": 1}\n' + t, "not a kvscope recording"),
    (lambda t: t.replace("\n", "\n{oops\n", 2), "not JSON"),
])
def test_a_damaged_or_foreign_file_gets_one_clear_message(kvscope_run, tmp_path, damage, says):
    _, rec, _ = kvscope_run
    text = rec.save(tmp_path / "ok.kvrec").read_text()
    bad = tmp_path / "bad.kvrec"
    bad.write_text(damage(text))
    with pytest.raises(RecordingError, match=says) as err:
        Recording.load(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_a_truncated_gzip_and_binary_junk(kvscope_run, tmp_path):
    _, _, path = kvscope_run
    cut = tmp_path / "cut.kvrec.gz"
    cut.write_bytes(path.read_bytes()[:200])
    with pytest.raises(RecordingError, match=r"damaged|ends without"):
        Recording.load(cut)
    junk = tmp_path / "junk.kvrec"
    junk.write_bytes(bytes(range(256)))
    with pytest.raises(RecordingError, match=r"damaged|not a kvscope recording"):
        Recording.load(junk)
    with pytest.raises(RecordingError, match="no such file"):
        Recording.load(tmp_path / "missing.kvrec")


def test_a_partial_file_reads_with_partial_true(kvscope_run, tmp_path):
    _, rec, _ = kvscope_run
    lines = rec.save(tmp_path / "ok.kvrec").read_text().splitlines(keepends=True)
    part = tmp_path / "part.kvrec"
    part.write_text("".join(lines[:-1]))
    got = Recording.load(part, partial=True)
    assert len(got.requests) == len(rec.requests)
    assert json.loads(lines[-1])["kind"] == "end"


def test_save_recording_needs_entries(tmp_path):
    with pytest.raises(ValueError, match="nothing was added"):
        save_recording([], tmp_path / "empty.kvrec")


def test_steps_a_feed_dropped_are_named(kvscope_run, tmp_path):
    s, _, _ = kvscope_run
    history = s.history
    dropped = history[:10] + history[13:]   # steps 10-12 never reached the writer
    got = Recording.load(save_recording(dropped, tmp_path / "gap.kvrec"))
    assert any("steps 10-12 are missing" in n for n in got.source.notes)
    assert len(got.steps) == len(history) - 4
