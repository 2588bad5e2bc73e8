"""The e2e scripts' main: unittest's, with the exit code ctest reads. A class that could only
skip (no root, no etcd, no Slurm, no GPU...) exits 77, which every e2e test declares as
SKIP_RETURN_CODE (tests/e2e/CMakeLists.txt), so it is reported skipped, never passed."""

import sys
import unittest


def main(cleanup=None):
    """unittest.main() over the calling module's tests; `cleanup` runs after them, always."""
    try:
        program = unittest.main(module="__main__", exit=False)
    finally:
        if cleanup is not None:
            cleanup()
    r = program.result
    if r.failures or r.errors or r.unexpectedSuccesses:
        sys.exit(1)
    if r.skipped and r.testsRun <= len(r.skipped):
        sys.exit(77)
    sys.exit(0)
