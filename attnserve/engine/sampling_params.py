"""SamplingParams' old home: the record lives in :mod:`attnserve.core.sampling_params`, shared with the model
runner; this name stays for code outside the package that imports it from here."""

from attnserve.core.sampling_params import (  # noqa: F401 (re-exported)
    ALLOWED,
    MAX_LOGPROBS,
    SamplingParams,
    SamplingParamsError,
    completion_seed,
)
