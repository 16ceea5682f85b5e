"""The state machines as pytest test cases, for HypoFuzz (`make fuzz-long`): the lockstep's, per
backend and configuration, and the serving loop's.

HypoFuzz collects Hypothesis tests through pytest and fuzzes them as one long, multi-process,
coverage-guided campaign, sharing the example database (.hypothesis/) with `dev` runs. This
file is not named test_*, so the ordinary suite never collects it; pass it explicitly.
"""

from __future__ import annotations

from ttmirror.conformance.machine import Recorder, machine
from ttmirror.conformance.profiles import profile, serving_settings
from ttmirror.conformance.serving_loop import ServingLoop
from ttmirror.model.state import Bounds

TestConformanceTT = machine(Bounds(), "tt", Recorder()).TestCase
TestConformanceTT.settings = profile("dev")
TestConformanceTTOneQueue = machine(Bounds(), "tt", Recorder(), "eager-1cq").TestCase
TestConformanceTTOneQueue.settings = profile("dev")
TestConformanceTTTraced = machine(Bounds(), "tt", Recorder(), "traced").TestCase
TestConformanceTTTraced.settings = profile("dev")
TestConformanceCpu = machine(Bounds(), "cpu", Recorder()).TestCase
TestConformanceCpu.settings = profile("dev")
TestServingLoop = ServingLoop.TestCase
TestServingLoop.settings = serving_settings("dev")
