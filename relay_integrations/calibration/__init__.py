"""Calibration: choosing a model pair's switch cues from the small model's margins.

The large model writes reasoning traces (or you bring your own); the small model scores each
one in a single prefill; a candidate cue is kept when the small model is reliably confident
after it. The result is a :class:`~relay_integrations.relay.artifact.CueArtifact` that the
switcher loads. ``relaygen calibrate`` runs it all from the command line.
"""

from ..jobs.datasets import DatasetError, ProblemSet
from .calibrator import CalibrationOutcome, Calibrator, NoCueSelected
from .candidates import DEFAULT_CANDIDATES
from .scoring import ScoringError, TraceScorer
from .statistics import CalibrationStatistics, ScoredTrace, cue_statistics
from .traces import Trace, TraceFile, ready_traces, write_traces

__all__ = [
    "DEFAULT_CANDIDATES",
    "CalibrationOutcome",
    "CalibrationStatistics",
    "Calibrator",
    "DatasetError",
    "NoCueSelected",
    "ProblemSet",
    "ScoredTrace",
    "ScoringError",
    "Trace",
    "TraceFile",
    "TraceScorer",
    "cue_statistics",
    "ready_traces",
    "write_traces",
]
