"""The engine step a request arriving at an independent time waits behind (issue #49).

Where requests are staggered (a client that draws its lengths from a range, or Poisson arrivals:
trtkv.plan.waves.Arrival.STAGGERED), a new request reaches an engine whose other C - 1 requests are
decoding: a step is in flight, and the engine takes new requests only between steps. Each of the
three engines' loops reads its input queue once per step, and with its default CPU/GPU overlap it
has already scheduled the next step when it does, so the new request's prefill runs one step later:

- vLLM 0.32.0 (trtkv's pin; vllm/v1/engine/core.py): `run_busy_loop` drains the input queue
  (`_process_input_queue`) and then calls `step_fn`; with async scheduling that is
  `step_with_batch_queue`, which schedules and submits step N+1 before blocking on step N (a batch
  queue of `max_concurrent_batches` = 2, vllm/config/vllm.py). `SchedulerConfig.async_scheduling`
  defaults to None, which `VllmConfig` turns on unless the model pools, decodes speculatively
  without EAGLE/n-gram/draft models, or runs pipeline parallelism on the V1 runner. The published
  vLLM 0.13.0 run sets it (InferenceX benchmarks/gptoss_fp4_h100_slurm.sh: `async-scheduling:
  true`).
- TensorRT-LLM (tensorrt_llm/_torch/pyexecutor/py_executor.py, `_executor_loop_overlap`, the
  default: `disable_overlap_scheduler` False; read at NVIDIA/TensorRT-LLM@9521caf and in a later
  1.x file that fetches inside `_prepare_and_schedule_batch`): each iteration fetches new requests
  and schedules, launches the batch (`_forward_step`), then waits on the previous batch's sampler
  event (`_process_previous_batch` / `_update_requests`); the next fetch comes when the previous
  batch ends, with this one already launched.
- SGLang 0.5.23 (sglang/srt/managers/scheduler.py, `event_loop_overlap`, the default without
  --disable-overlap-schedule): `ingest_requests`, `get_next_batch_to_run`, `run_batch`, then
  `pop_and_process` of the last batch.

So a request arriving while step N runs is taken in when N ends, and its prefill is scheduled into
N + 2, after N + 1 (already scheduled) runs: it waits the rest of N (half a step on average, for
arrivals independent of the step clock) plus one whole step; without the overlap only the rest of
N. The step in flight is priced as the decode step of the requests in flight (a mixed prefill step
among them is left out: at C requests of a prompt each per cycle of about OSL steps it is rare).
With one request (C = 1) nothing is in flight when the next one arrives, and with one output token
none of the others decodes (speed.serve passes C = 1 then): no wait.
"""

from __future__ import annotations

from trtkv.recipe import SPEED_ENGINES


def in_flight_steps(engine: str, concurrency: int) -> float:
    """Decode steps a staggered request waits before the step that schedules its prefill: the rest
    of the step in flight (half of it on average) and, where the engine (aiconfigurator's name)
    overlaps scheduling with the step (SpeedEngine.overlap), the step already scheduled; none where
    it arrives alone."""
    if concurrency <= 1:
        return 0.0
    return 0.5 + (1.0 if SPEED_ENGINES[engine].overlap else 0.0)


def in_flight_ms(engine: str, decode_step_ms: float, concurrency: int) -> float:
    """The wait of in_flight_steps in ms, at the decode step of `concurrency` requests."""
    return in_flight_steps(engine, concurrency) * decode_step_ms
