"""The memory part's measured process (run by ``parts.memory``, never by hand).

``python -m gshare.gpukit.parts.memchild --cap-mb C [--hold]`` under the interposer with
``GSHARE_CUDA_MEM_LIMIT_MB=C``: reads what ``torch.cuda.mem_get_info`` shows, allocates a
quarter of the cap, then twice the cap (which must raise ``torch.cuda.OutOfMemoryError``),
then a quarter again (the process must go on), and prints one JSON line. With ``--hold`` it
then says ``ready`` and keeps its memory until a line arrives on stdin (the neighbour test).
``--neighbour-mb N`` instead allocates N MiB without any cap and reports whether it could.
"""

from __future__ import annotations

import argparse
import json
import sys

MIB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cap-mb", type=int, default=1024)
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--neighbour-mb", type=int, default=0)
    a = ap.parse_args()
    import torch

    out: dict[str, object] = {}
    if a.neighbour_mb:
        try:
            x = torch.empty(a.neighbour_mb * MIB, dtype=torch.uint8, device="cuda")
            x.fill_(1)
            torch.cuda.synchronize()
            out["neighbour_ok"] = True
        except torch.cuda.OutOfMemoryError as e:
            out.update(neighbour_ok=False, error=str(e)[:300])
        print(json.dumps(out), flush=True)
        return
    free, total = torch.cuda.mem_get_info()
    out.update(info_free_bytes=free, info_total_bytes=total)
    keep = [torch.empty(a.cap_mb * MIB // 4, dtype=torch.uint8, device="cuda")]
    try:
        keep.append(torch.empty(2 * a.cap_mb * MIB, dtype=torch.uint8, device="cuda"))
        keep[-1].fill_(1)
        torch.cuda.synchronize()
        out["over_cap_refused"] = False
    except torch.cuda.OutOfMemoryError as e:
        out.update(over_cap_refused=True, error=str(e).splitlines()[0][:300])
    try:
        keep.append(torch.empty(a.cap_mb * MIB // 4, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        out["alive_after"] = True
    except Exception as e:  # noqa: BLE001 -- what went wrong is the measurement
        out.update(alive_after=False, after_error=f"{type(e).__name__}: {str(e)[:200]}")
    out["reserved_bytes"] = torch.cuda.memory_reserved()
    print(json.dumps(out), flush=True)
    if a.hold:
        print("ready", flush=True)
        sys.stdin.readline()


if __name__ == "__main__":
    main()
