"""Fixtures the live modules share."""
import os

import pytest

from scripts.slurm_cluster import SlurmCluster, missing_commands


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """One real Slurm (munged, slurmctld, two slurmd on this host) for every module that needs one:
    it takes about 11 s to start and is stopped once, at the end of the session."""
    missing = missing_commands()
    if missing or os.geteuid() != 0:
        pytest.skip(f"needs root and Slurm/munge (apt-get install slurm-wlm munge): missing {', '.join(missing)}")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield c
    c.stop()
