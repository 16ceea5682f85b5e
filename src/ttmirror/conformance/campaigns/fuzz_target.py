"""The state machines as pytest test cases, for HypoFuzz (`make fuzz-long`): the lockstep's, per
backend and configuration, and the serving loop's.

HypoFuzz collects Hypothesis tests through pytest and fuzzes them as one long, multi-process,
coverage-guided campaign, sharing the example database (.hypothesis/) with `dev` runs. This
file is not named test_*, so the ordinary suite never collects it; pass it explicitly.
"""

from __future__ import annotations

import os

from hypothesis import settings

from ttmirror.conformance.bugs import planted_bug
from ttmirror.conformance.campaigns.databases import ENV, open_database
from ttmirror.conformance.campaigns.profiles import profile, serving_settings
from ttmirror.conformance.lockstep.machine import Recorder, machine
from ttmirror.conformance.soak.serving_loop import ServingLoop
from ttmirror.model.state import Bounds

# $TTMIRROR_DATABASE (make fuzz-long DATABASE=...): a folder or redis://HOST:PORT/DB shared by
# every machine of the campaign; unset, the dev profile's local database.
_SHARED = open_database(os.environ[ENV]) if os.environ.get(ENV) else None


BUG = planted_bug()
"""$TTMIRROR_BUG: the bug the lockstep's campaigns plant (None: the implementation as it is)."""


def _dev(base: settings) -> settings:
    return base if _SHARED is None else settings(base, database=_SHARED)


TestConformanceTT = machine(Bounds(), "tt", Recorder(), bug=BUG).TestCase
TestConformanceTT.settings = _dev(profile("dev"))
TestConformanceTTOneQueue = machine(Bounds(), "tt", Recorder(), "eager-1cq", BUG).TestCase
TestConformanceTTOneQueue.settings = _dev(profile("dev"))
TestConformanceTTTraced = machine(Bounds(), "tt", Recorder(), "traced", BUG).TestCase
TestConformanceTTTraced.settings = _dev(profile("dev"))
TestConformanceCpu = machine(Bounds(), "cpu", Recorder(), bug=BUG).TestCase
TestConformanceCpu.settings = _dev(profile("dev"))
TestServingLoop = ServingLoop.TestCase
TestServingLoop.settings = _dev(serving_settings("dev"))
