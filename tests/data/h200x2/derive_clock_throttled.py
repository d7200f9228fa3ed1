"""Derive clock-throttled-rank1.tar.gz from healthy.tar.gz: the same real 2-rank H200 capture, with
the NVML clock reads the gpu probe now makes (nvmlDeviceGetClockInfo(SM), nvmlDeviceGetMaxClockInfo(SM),
nvmlDeviceGetCurrentClocksEventReasons, the PCIe replay and ECC counters) written as a driver returns
them: clocks in MHz (an H200's SM clock tops out at 1980 MHz), the reasons as nvml.h's bitmask
(0x20 SW thermal slowdown | 0x40 HW thermal slowdown = 96), counters as integers. GPU 0 (rank 0)
runs at its full clock with no reason set; GPU 1 (rank 1) runs at 1275 MHz, thermally slowed, hot.
The lent H200 node's settings are not ours to change, so a throttled GPU is written, not provoked.

    python tests/data/h200x2/derive_clock_throttled.py
"""
import io
import json
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_SM_MHZ = 1980
SLOW_SM_MHZ = 1275
THERMAL = 0x20 | 0x40


def main() -> None:
    src = tarfile.open(HERE / "healthy.tar.gz")
    out_buf = io.BytesIO()
    with tarfile.open(fileobj=out_buf, mode="w:gz") as out:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            name = m.name.replace("healthy/", "clock-throttled-rank1/", 1)
            if m.name.endswith("captures/gpu.json"):
                cap = json.loads(data)
                nv = json.loads(cap["artifacts"]["nvml.json"])
                for g in nv["gpus"]:
                    n = len(g["polls"])
                    slow = g["index"] == 1
                    g["device"]["max_sm_clock_mhz"] = MAX_SM_MHZ
                    g["sm_clock_mhz"] = [SLOW_SM_MHZ if slow else MAX_SM_MHZ] * n
                    g["clocks_event_reasons"] = [THERMAL if slow else 0] * n
                    if slow:
                        g["temp_c"] = [88] * n
                    g["counters_start"] = {"pcie_replays": 0, "ecc_corrected": 0, "ecc_uncorrected": 0}
                    g["counters_end"] = {"pcie_replays": 0, "ecc_corrected": 0, "ecc_uncorrected": 0}
                cap["artifacts"]["nvml.json"] = json.dumps(nv, separators=(",", ":"))
                data = json.dumps(cap).encode()
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = m.mtime, m.mode
            if data is None:
                info.type = m.type
                out.addfile(info)
            else:
                info.size = len(data)
                out.addfile(info, io.BytesIO(data))
    (HERE / "clock-throttled-rank1.tar.gz").write_bytes(out_buf.getvalue())


if __name__ == "__main__":
    main()
