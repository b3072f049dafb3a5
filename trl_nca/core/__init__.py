"""The core: the divergences on hidden states, the two views and their alignment, exact shared-prefix reuse, the anchor
weight's schedule, gradient cosines, sampling, launch checks and number checks. Pure torch (and Transformers models
called as modules): nothing here knows a Trainer or prints a run's log (the `core-knows-no-trainer` import
contract of pyproject.toml)."""
