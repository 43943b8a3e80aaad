"""The server's dynamic batcher on its own: batches across requests, admission, timeouts, fairness.
A stub run_batch held by a Gate stands in for the model, so no test waits on a clock."""
import asyncio
import threading

import pytest
from helpers import Gate

from spanflow.serving.batcher import DynamicBatcher, Overloaded, TooMuchWork


def run(coro):
    return asyncio.run(coro)


def test_batcher_batches_across_requests_and_keeps_order():
    seen = []

    def run_batch(units):
        seen.append(len(units))
        return [u * 10 for u in units]

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=64, max_wait_ms=20)
        b.start()
        reqs = [b.submit([i, i + 100], [4, 4]) for i in range(8)]
        out = await asyncio.gather(*reqs)
        await b.close()
        return out

    out = run(main())
    assert out == [[i * 10, (i + 100) * 10] for i in range(8)]
    assert seen == [16]  # the 8 requests queued together fill one 64-token batch


def test_batcher_runs_a_mixed_batch_as_similar_length_parts_in_order():
    parts = []

    def run_batch(units):
        parts.append(sorted(len(u) for u in units))
        return [u.upper() for u in units]

    texts = ["a" * n for n in (4, 40, 4, 40, 4, 40)]  # one request: all fit one 1024-token budget

    async def main(min_split_tokens):
        b = DynamicBatcher(run_batch, max_tokens=1024, max_wait_ms=1, min_split_tokens=min_split_tokens)
        b.start()
        out = await b.submit(texts, [len(t) for t in texts])
        await b.close()
        return out

    assert run(main(None)) == [t.upper() for t in texts]  # 240 padded tokens: under a quarter budget, one batch
    assert parts == [[4, 4, 4, 40, 40, 40]]
    parts.clear()
    assert run(main(0)) == [t.upper() for t in texts]  # split: short and long texts apart, results in order
    assert sorted(parts) == [[4, 4, 4], [40, 40, 40]]


def test_batcher_per_request_mode_never_mixes_requests():
    sizes = []

    async def main():
        b = DynamicBatcher(lambda u: sizes.append(len(u)) or u, max_tokens=64, max_wait_ms=1, per_request=True)
        b.start()
        out = await asyncio.gather(*[b.submit([k, k], [4, 4]) for k in range(5)])
        await b.close()
        return out

    assert run(main()) == [[k, k] for k in range(5)]
    assert sizes == [2] * 5  # five requests that would share one batch ran one by one


def test_batcher_refuses_what_the_queue_cannot_hold_and_drops_timed_out_work():
    gate, ran = Gate(), []

    def run_batch(units):
        ran.extend(units)
        if units == [1, 2]:
            gate.hold()
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, max_queue_tokens=16)
        b.start()
        first = asyncio.ensure_future(b.submit([1, 2, 3, 4], [4, 4, 4, 4]))  # two batches of two
        await gate.running()  # [1, 2] runs; [3, 4] waits: 8 tokens queued
        assert b.queued_tokens == 8
        with pytest.raises(Overloaded) as e:
            await asyncio.wait_for(b.submit([5] * 3, [4] * 3), 10)  # 8 + 12 tokens: over 16
        assert e.value.retry_after_s >= 1
        with pytest.raises(asyncio.TimeoutError):
            await b.submit([6], [4], timeout_s=0.01)  # admitted (8 + 4 tokens), but the model is held
        gate.released.set()
        assert await first == [1, 2, 3, 4]  # admitted work is still served
        assert await b.submit([7], [4]) == [7]
        await b.close()
        return b.queued_tokens

    assert gate.run(main()) == 0
    assert ran == [1, 2, 3, 4, 7]  # the refused and the timed-out units never ran


def test_batcher_answers_each_part_as_it_finishes_on_one_model_thread():
    answered, threads, seen_answer = threading.Event(), [], []

    def run_batch(units):
        threads.append(threading.current_thread())
        if units == ["s"]:  # the second part: the first part's request must be answered by now
            seen_answer.append(answered.wait(timeout=30))
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=1024, max_wait_ms=20, min_split_tokens=0)
        b.start()
        long = asyncio.ensure_future(b.submit(["l" * 40], [40]))
        long.add_done_callback(lambda _: answered.set())
        short = asyncio.ensure_future(b.submit(["s"], [4]))
        out = await asyncio.gather(long, short)
        await b.close()
        return out

    assert run(main()) == [["l" * 40], ["s"]]
    assert seen_answer == [True]  # parts are [long], [short] (longest first); long answered before short ran
    assert len({id(t) for t in threads}) == 1 and threads[0].name.startswith("spanflow-model")


def test_batcher_refuses_work_it_could_not_start_in_time_and_recovers():
    now, gate = [0.0], Gate()

    def run_batch(units):  # 8 tokens per 0.1 s of the batcher's clock
        now[0] += 0.1
        if units == [2, 3]:  # the second batch of the request below holds the model
            gate.hold()
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, max_queue_wait_s=0.05, clock=lambda: now[0])
        b.start()
        await b.warm_up([0], [4])  # its first call is not timed; a full call (8 tokens) and a single one are
        assert b.service.fit() == pytest.approx((0.1, 0.0), abs=1e-9) and b.queue_wait_s() == 0  # 0.1 s a call
        first = asyncio.ensure_future(b.submit(list(range(8)), [4] * 8))  # 4 batches of 2
        await gate.running()  # [0, 1] ran in 0.1 s, [2, 3] runs, 16 tokens wait: two more calls
        # two calls queued, but round robin starts new work after one of them
        assert b.queue_wait_s() == pytest.approx(0.1) and b.queued_tokens == 16
        with pytest.raises(Overloaded) as e:
            await asyncio.wait_for(b.submit([99], [4]), 10)  # 0.1 s before it starts: over 0.05 s
        assert e.value.retry_after_s >= 1
        assert str(e.value) == ("the queued work would start in about 100 ms, over the 50 ms queue wait bound; "
                                "retry after 1s")
        gate.released.set()
        assert await first == list(range(8))  # admitted work is still served
        assert await b.submit([7], [4]) == [7]  # the queue drained: admitted again
        await b.close()

    gate.run(main())


def test_a_huge_request_does_not_stall_a_small_one():
    order, gate = [], Gate()

    def run_batch(units):
        order.append(tuple(units))
        if len(order) == 1:  # the huge request's first batch holds the model while the small one queues
            gate.hold()
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, max_queue_tokens=10**6)
        b.start()
        big = asyncio.ensure_future(b.submit(list(range(100)), [8] * 100))
        await gate.running()
        small = asyncio.ensure_future(b.submit(["s"], [8]))
        await asyncio.sleep(0)  # one pass of the event loop: the small request queues
        assert b.queued_tokens == 99 * 8 + 8
        gate.released.set()
        assert await small == ["s"]
        done_big = big.done()
        assert await big == list(range(100))
        await b.close()
        return done_big

    assert not gate.run(main())  # the small request was answered while the huge one still ran
    assert order.index(("s",)) <= 2 and len(order) == 101  # round robin: served within two batches


def test_a_huge_request_an_empty_queue_took_does_not_lock_small_ones_out():
    """An empty queue takes a request above the token bound; small requests behind it were all
    refused (429) while it ran, as the whole of its work counted as their wait. Round robin starts
    them after one of its batches: they are admitted and answered while it runs."""
    now, gate, order = [0.0], Gate(), []

    def run_batch(units):  # 0.1 s a call of the batcher's clock
        now[0] += 0.1
        order.append(tuple(units))
        if units == [0, 1]:
            gate.hold()
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, max_queue_tokens=64, max_queue_wait_s=0.55,
                           clock=lambda: now[0])
        b.start()
        await b.warm_up(["w"], [4])
        order.clear()
        huge = asyncio.ensure_future(b.submit(list(range(100)), [4] * 100))  # 400 tokens: 5 s of work
        await gate.running()
        assert b.queued_tokens == 392 and b.queue_wait_s() == pytest.approx(0.1)  # one of its batches
        small = [asyncio.ensure_future(b.submit([f"s{k}"], [4])) for k in range(8)]
        await asyncio.sleep(0)  # each submitted: admitted, not refused (a yield, it times nothing)
        # one batch of the huge request, then the small ones share batches: 4 calls for 32 tokens, not 8
        assert b.queue_wait_s() == pytest.approx(0.5)
        with pytest.raises(Overloaded, match="queue full"):  # the token bound still keeps large ones out
            await b.submit(list(range(4)), [4] * 4)
        gate.released.set()
        got = await asyncio.gather(*small)
        answered_first = not huge.done()
        await huge
        await b.close()
        return got, answered_first

    got, answered_first = gate.run(main())
    assert got == [[f"s{k}"] for k in range(8)] and answered_first
    firsts = [next(k for k, batch in enumerate(order) if f"s{j}" in batch) for j in range(8)]
    assert max(firsts) <= 10  # within a few batches of the 50 the huge request takes


def test_a_request_whose_own_work_outlasts_its_timeout_is_refused_at_once():
    now = [0.0]

    def run_batch(units):
        now[0] += 0.1
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, clock=lambda: now[0])
        b.start()
        await b.warm_up(["w"], [4])
        ran = len(b.service.calls)
        with pytest.raises(TooMuchWork, match=r"this request is 400 tokens, at least 5\.00s of model time at the "
                                              r"fastest rate measured, over its 2s timeout"):
            await b.submit(list(range(100)), [4] * 100, timeout_s=2.0)
        assert len(b.service.calls) == ran and b.queued_tokens == 0  # nothing ran, nothing queued
        assert await b.submit(list(range(10)), [4] * 10, timeout_s=2.0) == list(range(10))  # 0.5 s: served
        # the bound is the request's size against its whole timeout, never the time its wait (for the
        # tokenizer, say) left it: 1.8 s of work, over the 0.2 s left and within the whole 2 s, runs
        assert await b.submit(list(range(36)), [4] * 36, timeout_s=0.2, whole_s=2.0) == list(range(36))
        with pytest.raises(TooMuchWork, match="over its 1.7s timeout"):
            await b.submit(list(range(36)), [4] * 36, timeout_s=0.2, whole_s=1.7)
        await b.close()

    run(main())


def test_the_warm_ups_first_full_call_does_not_set_the_rate():
    """The first call of a shape pays for its kernels and buffers: timed, it made the rate ten
    times too slow, and a fresh server refused (413) requests it serves in a tenth of its timeout."""
    now, seen = [0.0], set()

    def run_batch(units):
        now[0] += 0.1 if len(units) in seen else 1.0  # 8 tokens in 0.1 s, once the shape has run
        seen.add(len(units))
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, clock=lambda: now[0])
        b.start()
        await b.warm_up(["w"], [4])
        assert b.service.least(80) == pytest.approx(1.0)
        assert await b.submit(list(range(20)), [4] * 20, timeout_s=None, whole_s=2.0) == list(range(20))
        await b.close()

    run(main())


def test_calls_measured_anew_replace_those_timed_beside_a_compile():
    """Calls served while a compile ran beside them were slow; once the model ran compiled their
    times still held the queue wait over its bound, and most of each burst was refused (refused
    requests measure nothing). The server times its calls anew after the swap (serving/app.py)."""
    now, cost = [0.0], [1.0]

    def run_batch(units):
        now[0] += cost[0]
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=8, max_wait_ms=1, max_queue_wait_s=0.5, clock=lambda: now[0])
        b.start()
        await b.warm_up(["w"], [4])
        assert b.service.fit() == pytest.approx((1.0, 0.0))  # a call a second: the slow, eager calls
        slow = b.service
        cost[0] = 0.1  # compiled
        await asyncio.get_running_loop().run_in_executor(None, lambda: b.time_calls(["w"], [4], anew=True))
        assert b.service is not slow and b.service.fit() == pytest.approx((0.1, 0.0))
        assert b.service.least(8) == pytest.approx(0.1)  # the fastest rate is the new one's too
        await b.close()

    run(main())


def test_a_warm_up_whose_full_call_fails_refuses_nothing_by_its_single_call():
    """The single call's fixed cost spread over its few tokens set the bound ten times too high:
    requests the model serves in a fifth of their timeout got 413."""
    now, warming = [0.0], [True]

    def run_batch(units):
        if warming[0] and len(units) > 1:
            raise MemoryError("the full budget does not fit")  # as at a start beside other work
        now[0] += 0.02 + 0.0002 * 4 * len(units)  # 20 ms a call, 0.2 ms a token
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=64, max_wait_ms=1, clock=lambda: now[0])
        b.start()
        await b.warm_up(["w"], [4])
        warming[0] = False
        assert b.service.least(1600) is None  # no call of half the budget yet: no bound
        assert await b.submit(list(range(400)), [4] * 400, timeout_s=None, whole_s=5.0) is not None
        await b.close()

    run(main())


def test_a_timed_out_request_leaves_the_queue_at_once():
    """Its tokens counted in the queue until the worker next reached it: the next request was
    refused for work that would never run."""
    gate = Gate()

    def run_batch(units):
        if units == [1]:
            gate.hold()
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=4, max_wait_ms=1, max_queue_tokens=16)
        b.start()
        first = asyncio.ensure_future(b.submit([1], [4]))
        await gate.running()
        with pytest.raises(asyncio.TimeoutError):
            await b.submit([2] * 10, [4] * 10, timeout_s=0.01)  # an empty queue took it; the model is held
        queued = b.queued_tokens
        gate.released.set()
        await first
        await b.close()
        return queued

    assert gate.run(main()) == 0


def test_a_cancelled_request_leaves_the_queue_and_the_model_never_runs_it():
    gate, ran = Gate(), []

    def run_batch(units):
        ran.extend(units)
        if units == [1]:
            gate.hold()
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=4, max_wait_ms=1)
        b.start()
        first = asyncio.ensure_future(b.submit([1], [4]))
        await gate.running()
        gone = asyncio.ensure_future(b.submit([2], [4], timeout_s=30))  # a client that disconnects
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        gate.released.set()
        assert await first == [1] and await b.submit([3], [4]) == [3]
        await b.close()
        return b.queued_tokens

    assert gate.run(main()) == 0
    assert ran == [1, 3]


def test_a_burst_one_call_serves_is_admitted_after_lone_requests():
    """Lone requests show only the fixed cost of a call (0.1 s whatever its size, here); a rate
    read from them (40 tokens/s) took a burst of ten 4-token requests for a second of work."""
    now, gate = [0.0], Gate()

    def run_batch(units):
        now[0] += 0.1
        if units == ["hold"]:
            gate.hold()
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=64, max_wait_ms=1, max_queue_wait_s=0.5, clock=lambda: now[0])
        b.start()
        for k in range(3):
            assert await b.submit([k], [4]) == [k]
        held = asyncio.ensure_future(b.submit(["hold"], [4]))
        await gate.running()
        burst = [asyncio.ensure_future(b.submit([k], [4])) for k in range(10)]
        await asyncio.sleep(0)  # every one submitted (the sleep yields to them, it times nothing)
        wait = b.queue_wait_s()
        gate.released.set()
        out = await asyncio.gather(held, *burst)
        await b.close()
        return wait, out

    wait, out = gate.run(main())
    assert wait == pytest.approx(0.1)  # 40 tokens: one call
    assert out == [["hold"]] + [[k] for k in range(10)]  # none refused


def test_service_time_separates_the_fixed_cost_of_a_call_from_its_tokens():
    from spanflow.serving.batcher import ServiceTime

    st = ServiceTime()
    assert st.seconds(100, 64) is None
    for n in (8, 64, 8, 64):
        st.add(n, 0.1 + 0.01 * n)
    fixed, per_token = st.fit()
    assert fixed == pytest.approx(0.1) and per_token == pytest.approx(0.01)
    assert st.seconds(128, 64) == pytest.approx(2 * 0.1 + 1.28)  # two calls
    one = ServiceTime()
    one.add(8, 0.2)
    assert one.fit() == (0.2, 0.0)  # one size: all of it fixed, the least the queue can take


def test_the_wait_counts_a_call_a_request_unbatched_and_the_work_of_models_on_its_thread():
    now, gate = [0.0], Gate()

    def run_batch(units):  # 0.1 s a call, whatever its size
        now[0] += 0.1
        if units == ["hold"]:
            gate.hold()
        return units

    async def main():
        one_thread: list = []
        single = DynamicBatcher(run_batch, max_tokens=64, max_wait_ms=1, per_request=True, clock=lambda: now[0],
                                peers=one_thread)
        other = DynamicBatcher(run_batch, max_tokens=64, max_wait_ms=1, clock=lambda: now[0], peers=one_thread)
        for b in (single, other):
            b.start()
            await b.warm_up([0], [4])
        held = asyncio.ensure_future(single.submit(["hold"], [4]))
        await gate.running()
        queued = [asyncio.ensure_future(single.submit([k], [4])) for k in range(5)]
        await asyncio.sleep(0)  # every one submitted (a yield, not a wait for time)
        waits = single.queue_wait_s(), other.queue_wait_s()
        gate.released.set()
        await asyncio.gather(held, *queued)
        for b in (single, other):
            await b.close()
        return waits, one_thread == [single, other]

    (single_wait, other_wait), shared = gate.run(main())
    # five requests not batched together: five calls (20 tokens would fit one), and the other model waits for them
    assert single_wait == pytest.approx(0.5) and other_wait == pytest.approx(0.5) and shared


def test_a_warm_up_call_that_fails_leaves_the_server_to_measure_on_served_calls():
    def run_batch(units):
        if len(units) > 1:  # the full call of the warm-up runs out of memory, say
            raise RuntimeError("out of memory")
        return units

    async def main():
        b = DynamicBatcher(run_batch, max_tokens=64, max_wait_ms=1)
        b.start()
        await b.warm_up([0], [4])  # started all the same
        fit = b.service.fit()
        out = await b.submit([1], [4])
        await b.close()
        return fit, out, len(b.service.calls)

    fit, out, calls = run(main())
    assert out == [1] and calls == 2  # the single warm-up call and the served one
    assert fit is not None and fit[1] == 0.0
