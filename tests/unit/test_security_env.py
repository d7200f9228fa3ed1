"""Identifiers a job's user sets in its own environment (SLURM_JOB_ID, CUDA_VISIBLE_DEVICES,
LOCAL_RANK, RANK, WORLD_SIZE) are parsed into bounded, validated values, or "unknown", before they
reach a path, a label or a printed line (probes/parsers/envvars.py)."""
import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainprobe.agent.combiners.gpu_locality import visible_devices as locality_visible_devices
from trainprobe.agent.watch import bundle_name
from trainprobe.probes import placement
from trainprobe.probes.parsers import envvars, procfs
from trainprobe.probes.support import slurmjob
from trainprobe.reports import prometheus, watch_metrics

HUGE = "9" * 10_000


@pytest.mark.parametrize("raw, want", [
    ("0", 0), (" 3\n", 3), ("1048575", 1048575), (None, None),
    ("-1", None), ("+1", None), ("1e9", None), ("1_000", None), ("0x10", None), ("", None), ("abc", None),
    ("1048576", None), (HUGE, None), ("\u0663", None), ("\uff11", None), ("1\x002", None), ("2\n3", None),
])
def test_ranks_are_plain_bounded_numbers(raw, want):
    assert envvars.rank(raw) == want
    assert placement._int(raw) == want and slurmjob._int(raw) == want


@pytest.mark.parametrize("raw, want", [
    ("12345", "12345"), (" 77\n", "77"), (None, None),
    ("../../etc/x", "unknown"), ("a/b", "unknown"), ("1\n2", "unknown"), ("1\x002", "unknown"), (HUGE, "unknown"),
    ("", "unknown"), ("12_3", "unknown"), ("\u0661\u0662", "unknown"),
])
def test_slurm_job_ids_are_digits_or_unknown(raw, want):
    assert envvars.slurm_job_id(raw) == want


@pytest.mark.parametrize("raw", ["../../etc/x", "a/b", "x" * 10_000, "line\nbreak", "nul\x00byte", "..", "-rf",
                                 "\u202egnp.exe", "", ".hidden", "é"])
def test_a_token_is_one_safe_bounded_path_component(raw):
    tok = envvars.token(raw)
    assert tok and len(tok) <= envvars.MAX_TOKEN
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in tok)
    assert not tok.startswith((".", "-")) and os.path.basename(tok) == tok


@pytest.mark.parametrize("raw, want", [
    ("0,1", ["0", "1"]), (" 2 , 3 ", ["2", "3"]), ("GPU-6e4e17a9-2", ["GPU-6e4e17a9-2"]),
    ("MIG-GPU-6e4e17a9/1/0", ["MIG-GPU-6e4e17a9/1/0"]), (None, None), ("", []),
    ("-1", []), ("none", []), ("NoDevFiles", []), ("0,-1,1", ["0"]), ("1,garbage,2", ["1"]),
    ("GPU-../../x", []), ("GPU-../../x,0", []), ("\uff10", []), ("0\n1", []), ("0,,1", ["0"]),
    ("\x1b]0;pwned\x07", []),
])
def test_visible_devices_are_read_the_way_cuda_reads_them(raw, want):
    assert envvars.visible_devices(raw) == want
    assert locality_visible_devices(raw) == want


def test_ten_thousand_visible_devices_are_bounded():
    assert len(envvars.visible_devices(",".join(["0"] * 10_000))) == envvars.MAX_VISIBLE_DEVICES
    shown = envvars.cuda_visible_devices("GPU-../../x," + "0," * 5000 + "\x1b]0;pwned\x07")
    assert shown == ""                                   # what CUDA would see: nothing
    shown = envvars.cuda_visible_devices("0," * 5000)
    assert len(shown.split(",")) == envvars.MAX_VISIBLE_DEVICES
    assert envvars.cuda_visible_devices("-1") == "-1" and envvars.cuda_visible_devices(" 0,1 ") == "0,1"


def test_the_environ_parser_keeps_only_bounded_values():
    raw = b"\0".join([b"LOCAL_RANK=-1", b"RANK=" + HUGE.encode(), b"WORLD_SIZE=1e9",
                      b"SLURM_JOB_ID=../../etc/x\nid", b"CUDA_VISIBLE_DEVICES=GPU-../../x,0",
                      b"SLURMD_NODENAME=n1/../../x", b"SLURM_PROCID=3", b"HF_TOKEN=hf_secret", b"garbage\xff\xfe"])
    names = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES", "SLURMD_NODENAME",
             "SLURM_PROCID")
    env = procfs.parse_environ_whitelist(raw, names)
    assert env == {"LOCAL_RANK": "unknown", "RANK": "unknown", "WORLD_SIZE": "unknown", "SLURM_JOB_ID": "unknown",
                   "CUDA_VISIBLE_DEVICES": "", "SLURMD_NODENAME": "n1_.._.._x", "SLURM_PROCID": "3"}
    assert procfs.parse_environ_whitelist(b"LOCAL_RANK=2\0CUDA_VISIBLE_DEVICES=0,1") == \
        {"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "0,1"}


@pytest.mark.parametrize("job", ["../../etc/x", "a/b", "x" * 10_000, "1\n2", "nul\x00", "..", "", "12345"])
def test_watch_bundle_names_stay_in_the_bundle_directory(job, tmp_path):
    name = bundle_name("20250101T000000", job, 42)
    assert os.path.basename(name) == name and "\n" not in name and "\x00" not in name and len(name) < 120
    assert os.path.dirname(os.path.abspath(os.path.join(tmp_path, name))) == str(tmp_path)
    assert name.startswith("trainprobe-20250101T000000") and name.endswith("-pid42.tar.gz")
    assert ("-job" in name) == bool(job)


HOSTILE_LABEL = 'a"b\\c\nd}{x="y"'


def _labels(text):
    return [s.labels for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_prometheus_labels_are_escaped_by_the_exposition_format():
    doc = {"jobs": [{"root": 10, "job": HOSTILE_LABEL, "trainers": [{"pid": 10, "loop_wait_share": 0.5}],
                     "gpus": {}, "condition": True, "condition_held_s": 1.0, "diagnoses": 1,
                     "last_diagnosis_unix": 1.0, "last_finding": "dataloader.starved", "last_expected_speedup": 2.0}],
           "gpus": {}, "samples": 1, "agent_cpu_seconds": 0.1, "trigger": "gpu-busy<0.5"}
    text = watch_metrics.render(doc)
    assert all(line.startswith(("#", "trainprobe_watch_")) for line in text.splitlines() if line)
    jobs = {lab["slurm_job"] for lab in _labels(text) if "slurm_job" in lab}
    assert jobs == {HOSTILE_LABEL}
    rep = {"checks": [{"check": "c", "category": "host", "target": HOSTILE_LABEL, "status": "ok", "value": 1,
                       "duration_s": 0.1}],
           "host": {"hostname": HOSTILE_LABEL}, "profile": {"name": "p"}, "status": "ok", "exit_code": 0,
           "duration_s": 0.2, "started_unix": 1.0}
    labels = _labels(prometheus.render(rep))
    assert {lab.get("target") for lab in labels if "target" in lab} == {HOSTILE_LABEL}
    assert {lab.get("hostname") for lab in labels if "hostname" in lab} == {HOSTILE_LABEL}
