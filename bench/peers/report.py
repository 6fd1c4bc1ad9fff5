#!/usr/bin/env python3
"""Gathers the raw outputs of one `scripts/bench` run into a table, JSON and a chart.

    report.py machine --dirs DIR... > RAW/machine.json   (at the start of a run)
    report.py render --raw RAW --out OUT [--readme bench/README.md]

RAW holds what scripts/bench collected (every file is the last JSON line of a
program's output, next to its full .log):
  params.json                      gib, rounds, quick, locations
  machine.json                     this script's `machine` output
  {loc}-io-{k}.json                ckpt-bench-io, round k, location loc (shm, disk)
  {loc}-peers-{k}.json             bench/peers/peers.py, round k
  plan.json / plan-synthetic.json  ckpt-bench-plan (.log: one line per repeat)
  inspect.json or inspect.skip     ckpt-bench-inspect, or why it did not run
  torch.json or torch.skip         bench/peers/pytorch.py (ckpt next to DCP,
                                   safetensors and torch.save), or why not
Writes OUT/latest.txt (the table), OUT/latest.json, OUT/latest.md (table and
machine, for bench/README.md), OUT/torch.md (the PyTorch peers' table, for
the README) and OUT/latest.png (matplotlib, if installed). With --readme,
the text between the "latest run" markers of that file is replaced by
latest.md; with --torch-readme, the text between the "torch peers" markers
of that file by torch.md.

Every figure is the median over all runs (rounds x repeats) with its spread
[min - max]. A ratio of ckpt to the limit is the median of per-run ratios
(each run measures both back to back); a ratio of ckpt to the best peer is
the median over rounds of (ckpt's median in the round / the best peer's).
"""

import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PEERS = ("h5py", "torch", "numpy")
LOCATION_TITLE = {"shm": "/dev/shm", "disk": "disk"}
# The targets, on the uncompressed 4-rank configuration.
TARGET_RANKS = 4
TARGET_VS_LIMIT = {"shm": 0.85, "disk": 0.90}
TARGET_VS_PEER = {"torch": 2.0, "h5py": 1.2}


def median(v):
    v = sorted(v)
    n = len(v)
    if n == 0:
        return float("nan")
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def stat(v):
    v = [x for x in v if x is not None]
    if not v:
        return None
    return {"median": round(median(v), 4), "min": round(min(v), 4), "max": round(max(v), 4),
            "runs": [round(x, 4) for x in v]}


# ---- machine ----


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def machine(dirs):
    info = {"hostname": platform.node(), "kernel": platform.release(),
            "cores": os.cpu_count(), "loadavg_start": os.getloadavg()[0],
            "time": time.strftime("%Y-%m-%d %H:%M %Z")}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            info["cpu"] = m.group(1) if m else "?"
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemTotal:\s*(\d+) kB", f.read(), re.M)
            info["ram_GiB"] = round(int(m.group(1)) / 2**20, 1)
    except OSError:
        pass
    info["filesystems"] = {}
    for d in dirs:
        out = sh(["df", "--output=source,fstype,size", d]).splitlines()
        if len(out) == 2:
            src, fstype, size = out[1].split()
            info["filesystems"][d] = {"source": src, "fstype": fstype, "size": size}
    info["commit"] = sh(["git", "rev-parse", "--short", "HEAD"])
    return info


def machine_line(m, end_load):
    fs = ", ".join(f"{d}: {v['fstype']} on {v['source']}" for d, v in m.get("filesystems", {}).items())
    return (f"{m.get('cpu', '?')}, {m.get('cores')} cores, {m.get('ram_GiB')} GiB RAM, "
            f"Linux {m.get('kernel')}; {fs}; load average {m.get('loadavg_start', 0):.1f} at "
            f"the start, {end_load:.1f} at the end; commit {m.get('commit', '?')}, {m.get('time')}")


# ---- gathering ----


def load_json(path):
    with open(path) as f:
        return json.load(f)


def rounds_of(raw, loc, kind):
    files = glob.glob(os.path.join(raw, f"{loc}-{kind}-*.json"))
    return [load_json(f) for f in sorted(files, key=lambda p: int(re.findall(r"-(\d+)\.json$", p)[0]))]


def gather_location(raw, loc):
    io = rounds_of(raw, loc, "io")
    peers = rounds_of(raw, loc, "peers")
    if not io:
        return None
    cat = lambda rounds, f: [x for r in rounds for x in f(r)]  # noqa: E731
    out = {"dir": io[0]["dir"], "bytes": io[0]["bytes"], "rounds": len(io)}
    lim = out["limit"] = {}
    for key in ("write_GBps", "read_GBps", "write_cpu_s_per_GB", "read_cpu_s_per_GB",
                "memcpy_GBps", "memcpy_all_cores_GBps"):
        lim[key] = stat(cat(io, lambda r: r["limit"].get(key, [])))
    out["cores"] = io[0].get("cores")
    # Per round: medians, for the ratios to the best peer.
    per_round = []
    for k, r in enumerate(io):
        rr = {}
        for c in r["ckpt"]:
            if c.get("io", "buffered") == "buffered":
                rr[("ckpt", c["ranks"], c["codec"])] = (median(c["save_GBps"]), median(c["load_GBps"]))
        if k < len(peers):
            for p, by_ranks in peers[k]["peers"].items():
                for ranks, f in by_ranks.items():
                    rr[(p, int(ranks), "none")] = (median(f["save_GBps"]), median(f["load_GBps"]))
        per_round.append(rr)

    ckpt = out["ckpt"] = []
    key_of = lambda c: (c["ranks"], c["codec"], c.get("io", "buffered"))  # noqa: E731
    for c0 in io[0]["ckpt"]:
        sel = lambda r: [c for c in r["ckpt"] if key_of(c) == key_of(c0)]  # noqa: E731
        entry = {"ranks": c0["ranks"], "codec": c0["codec"], "io": c0.get("io", "buffered"),
                 "compression_ratio": c0.get("compression_ratio", 1)}
        for key in ("save_GBps", "load_GBps", "save_vs_limit", "load_vs_limit",
                    "save_cpu_s_per_GB", "load_cpu_s_per_GB"):
            entry[key] = stat(cat(io, lambda r: [x for c in sel(r) for x in c.get(key, [])]))
        if c0["codec"] == "none" and entry["io"] == "buffered":
            for op, i in (("save", 0), ("load", 1)):
                ratios, best = [], {}
                for rr in per_round:
                    mine = rr.get(("ckpt", c0["ranks"], "none"))
                    theirs = {p: rr[(p, c0["ranks"], "none")][i] for p in PEERS
                              if (p, c0["ranks"], "none") in rr}
                    if mine and theirs:
                        bp = max(theirs, key=theirs.get)
                        ratios.append(mine[i] / theirs[bp])
                        best[bp] = best.get(bp, 0) + 1
                        for p, v in theirs.items():
                            entry.setdefault(f"{op}_vs_{p}_runs", []).append(mine[i] / v)
                if ratios:
                    entry[f"{op}_vs_best_peer"] = stat(ratios)
                    entry[f"{op}_best_peer"] = max(best, key=best.get)
                for p in PEERS:
                    runs = entry.pop(f"{op}_vs_{p}_runs", None)
                    if runs:
                        entry[f"{op}_vs_{p}"] = stat(runs)
        ckpt.append(entry)
    if "reshard" in io[0]:
        rs = io[0]["reshard"]
        out["reshard"] = {"from": rs["from"], "to": rs["to"],
                          "load_GBps": stat(cat(io, lambda r: r["reshard"]["load_GBps"])),
                          "time_vs_same_layout": stat(cat(io, lambda r: r["reshard"]["time_vs_same_layout"]))}

    out["peers"], out["skipped"] = {}, {}
    if peers:
        out["skipped"] = peers[0].get("skipped", {})
        out["peer_versions"] = peers[0].get("versions", {})
        # Peer vs limit: the limit of the same round (its median).
        for p in PEERS:
            if p not in peers[0]["peers"]:
                continue
            out["peers"][p] = {}
            for ranks in peers[0]["peers"][p]:
                e = {}
                for op, lk in (("save", "write_GBps"), ("load", "read_GBps")):
                    vals, rel = [], []
                    for k, pr in enumerate(peers):
                        v = pr["peers"][p][ranks][f"{op}_GBps"]
                        vals += v
                        if k < len(io):
                            rel += [x / median(io[k]["limit"][lk]) for x in v]
                    e[f"{op}_GBps"] = stat(vals)
                    e[f"{op}_vs_limit"] = stat(rel)
                    e[f"{op}_cpu_s_per_GB"] = stat(
                        [x for pr in peers for x in pr["peers"][p][ranks].get(f"{op}_cpu_s_per_GB", [])])
                out["peers"][p][ranks] = e
    return out


def gather_metadata(raw, quick):
    md = {}
    p = os.path.join(raw, "plan.json")
    if os.path.exists(p):
        j = load_json(p)
        md["plan"] = j
        log = open(os.path.join(raw, "plan.log")).read()
        miss = [float(x) for x in re.findall(r"^repeat \d+: miss ([\d.]+) ms", log, re.M)]
        hits = [float(x) for a in re.findall(r"^repeat \d+: miss [\d.]+ ms, hits ([\d.]+ / [\d.]+) ms",
                                              log, re.M) for x in a.split(" / ")]
        md["plan"]["miss_ms_stat"] = stat(miss) or stat([j["miss_ms"]])
        md["plan"]["hit_ms_stat"] = stat(hits) or stat([j["hit_ms"]])
    p = os.path.join(raw, "plan-synthetic.json")
    if os.path.exists(p):
        j = load_json(p)
        md["plan_synthetic"] = j
        log = open(os.path.join(raw, "plan-synthetic.log")).read()
        wall = [float(x) for x in re.findall(r"^repeat \d+: ([\d.]+) ms", log, re.M)]
        cpu = [float(x) for x in re.findall(r"^repeat \d+: [\d.]+ ms, cpu ([\d.]+) ms", log, re.M)]
        md["plan_synthetic"]["plan_ms_stat"] = stat(wall) or stat([j["plan_ms"]])
        if cpu:
            md["plan_synthetic"]["plan_cpu_ms_stat"] = stat(cpu)
    p = os.path.join(raw, "inspect.json")
    if os.path.exists(p):
        md["inspect"] = load_json(p)
        args = os.path.join(raw, "inspect.args")
        if os.path.exists(args):
            md["inspect"]["args"] = open(args).read().strip()
    else:
        skip = os.path.join(raw, "inspect.skip")
        md["inspect_skipped"] = open(skip).read().strip() if os.path.exists(skip) else "not run"
    return md


# ---- the table ----


def fmt(s, unit=""):
    if s is None:
        return "-"
    return f"{s['median']:.2f}{unit}"


def spread(s, unit=""):
    if s is None:
        return ""
    return f"[{s['min']:.2f} - {s['max']:.2f}]{unit}"


def pct(s):
    if s is None:
        return ""
    return f"{100 * s['median']:.0f}% [{100 * s['min']:.0f}-{100 * s['max']:.0f}]"


def cpu(s):
    return "" if s is None else f"{s['median']:.2f}"


def location_rows(loc, L):
    # (what, GB/s, [min - max], CPU s/GB, vs limit, vs best peer)
    rows = []
    lim = L["limit"]
    rows.append(("limit  write+fsync, 1 stream", fmt(lim["write_GBps"]), spread(lim["write_GBps"]),
                 cpu(lim.get("write_cpu_s_per_GB")), "", ""))
    rows.append(("limit  read, 1 stream", fmt(lim["read_GBps"]), spread(lim["read_GBps"]),
                 cpu(lim.get("read_cpu_s_per_GB")), "", ""))
    rows.append(("limit  memcpy, 1 thread", fmt(lim["memcpy_GBps"]), spread(lim["memcpy_GBps"]), "", "", ""))
    rows.append((f"limit  memcpy, {L.get('cores')} threads", fmt(lim["memcpy_all_cores_GBps"]),
                 spread(lim["memcpy_all_cores_GBps"]), "", "", ""))
    for c in L["ckpt"]:
        r = c["ranks"]
        tag = ("" if c["codec"] == "none" else "zstd ") + ("O_DIRECT " if c["io"] == "direct" else "")
        ranks = f"{r} rank{'s' if r > 1 else ''}"
        for op in ("save", "load"):
            what = f"ckpt   {tag}{op}, {ranks}"
            if c["codec"] != "none":
                what += f" (ratio {c['compression_ratio']:.2f})"
            vp = ""
            if f"{op}_vs_best_peer" in c:
                s = c[f"{op}_vs_best_peer"]
                vp = f"{s['median']:.2f}x {c[f'{op}_best_peer']} [{s['min']:.2f}-{s['max']:.2f}]"
            rows.append((what, fmt(c[f"{op}_GBps"]), spread(c[f"{op}_GBps"]),
                         cpu(c.get(f"{op}_cpu_s_per_GB")), pct(c[f"{op}_vs_limit"]), vp))
        if ("reshard" in L and L["reshard"]["from"] == r and c["codec"] == "none"
                and c["io"] == "buffered"):
            rs = L["reshard"]
            t = rs["time_vs_same_layout"]
            rows.append((f"ckpt   resharded load {rs['from']}->{rs['to']} (rows->columns)",
                         fmt(rs["load_GBps"]), spread(rs["load_GBps"]), "",
                         f"{t['median']:.2f}x [{t['min']:.2f}-{t['max']:.2f}] same-layout time", ""))
    for p, by_ranks in L["peers"].items():
        for ranks, e in by_ranks.items():
            r = int(ranks)
            for op in ("save", "load"):
                rows.append((f"{p:<6} {op}, {r} rank{'s' if r > 1 else ''}", fmt(e[f"{op}_GBps"]),
                             spread(e[f"{op}_GBps"]), cpu(e.get(f"{op}_cpu_s_per_GB")),
                             pct(e[f"{op}_vs_limit"]), ""))
    for p, why in L["skipped"].items():
        rows.append((f"{p:<6} skipped: {why}", "", "", "", "", ""))
    if L.get("peers_skipped"):
        rows.append((f"peers  skipped: {L['peers_skipped']}", "", "", "", "", ""))
    return rows


def render_rows(title, rows):
    head = (title, "GB/s", "[min - max]", "CPU s/GB", "vs limit", "vs best peer")
    n = len(head)
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(n)]
    right = (1, 3)
    out = []
    for k, r in enumerate([head] + rows):
        out.append("  ".join(str(x).rjust(w) if i in right else str(x).ljust(w)
                             for i, (x, w) in enumerate(zip(r, widths))).rstrip())
        if k == 0:
            out.append("-" * len(out[0]))
    return out


def targets(res, quick):
    lines, checks = [], []
    for loc, L in res["locations"].items():
        c = next((c for c in L["ckpt"] if c["ranks"] == TARGET_RANKS and c["codec"] == "none"
                  and c["io"] == "buffered"), None)
        if c is None:
            continue
        goal = TARGET_VS_LIMIT[loc]
        for op in ("save", "load"):
            v = c[f"{op}_vs_limit"]["median"]
            checks.append({"location": loc, "what": f"{op} >= {goal:.0%} of the limit",
                           "value": round(v, 3), "met": v >= goal})
        if loc == "shm":
            for p, goal in TARGET_VS_PEER.items():
                s = c.get(f"save_vs_{p}")
                if s:
                    checks.append({"location": loc, "what": f"save >= {goal}x {p}",
                                   "value": s["median"], "met": s["median"] >= goal})
            for p in PEERS:
                s = c.get(f"load_vs_{p}")
                if s:
                    checks.append({"location": loc, "what": f"load faster than {p}",
                                   "value": s["median"], "met": s["median"] > 1})
    for t in checks:
        v = f"{100 * t['value']:.1f}%" if "limit" in t["what"] else f"{t['value']:.2f}x"
        lines.append(f"  {'met   ' if t['met'] else 'MISSED'}  {LOCATION_TITLE[t['location']]}: "
                     f"ckpt {TARGET_RANKS} ranks uncompressed {t['what']}: {v}")
    return checks, lines


def metadata_rows(md):
    out = []
    if "plan" in md:
        p = md["plan"]
        out.append(f"  plan, {p['ranks']} ranks x {p['tensors']} tensors: cache miss "
                   f"{fmt(p['miss_ms_stat'])} ms {spread(p['miss_ms_stat'])}, hit "
                   f"{fmt(p['hit_ms_stat'])} ms {spread(p['hit_ms_stat'])}")
    if "plan_synthetic" in md:
        p = md["plan_synthetic"]
        cpu = p.get("plan_cpu_ms_stat")
        out.append(f"  plan of a synthetic {p['synthetic_ranks']}-rank job x {p['tensors']} tensors "
                   f"(coordinator): {fmt(p['plan_ms_stat'])} ms {spread(p['plan_ms_stat'])}"
                   + (f", {fmt(cpu)} ms CPU" if cpu else ""))
    if "inspect" in md:
        j = md["inspect"]
        chunks = j.get("chunks")
        m = re.search(r"--ranks (\d+) --tensors (\d+)", j.get("args", ""))
        if chunks is None and m:
            chunks = int(m.group(1)) * int(m.group(2))
        chunks = chunks or 1 << 20
        ims = next((v for k, v in j.items() if k.startswith("inspect") and k.endswith("_ms")
                    and "cpu" not in k), None)
        icpu = next((v for k, v in j.items() if k.startswith("inspect") and "cpu" in k), None)
        out.append(f"  ckpt-inspect of a checkpoint of {chunks} chunks: {ims} ms"
                   + (f" ({icpu} ms CPU)" if icpu is not None else ""))
        if "validate_GBps" in j:
            out.append(f"  ckpt-validate: {j['validate_GBps']} GB/s, plain read of the same files "
                       f"{j.get('read_GBps', '-')} GB/s ({100 * j.get('validate_vs_read', 0):.0f}%)")
        vm = next((v for k, v in j.items() if k.startswith("validate") and k.endswith("chunks_s")), None)
        if vm is not None:
            out.append(f"  ckpt-validate of the {chunks}-chunk checkpoint: {vm} s")
    else:
        out.append(f"  ckpt-inspect / ckpt-validate: not available ({md.get('inspect_skipped')})")
    return out


def render(raw, out_dir, readme, torch_readme=None):
    params = load_json(os.path.join(raw, "params.json"))
    mach = load_json(os.path.join(raw, "machine.json"))
    # Recorded by scripts/bench when the measurements ended (a later render
    # must not describe the machine at render time).
    end_file = os.path.join(raw, "loadavg.end")
    end_load = float(open(end_file).read().split()[0]) if os.path.exists(end_file) else os.getloadavg()[0]
    res = {"params": params, "machine": dict(mach, loadavg_end=end_load), "locations": {}}
    for loc in ("shm", "disk"):
        L = gather_location(raw, loc)
        if L:
            res["locations"][loc] = L
    skip = os.path.join(raw, "peers.skip")
    if os.path.exists(skip):
        for L in res["locations"].values():
            L["peers_skipped"] = open(skip).read().strip()
    res["metadata"] = gather_metadata(raw, params.get("quick"))
    torch_res, torch_md = gather_torch(raw, mach, end_load)
    if torch_res is not None:
        res["torch"] = torch_res

    lines = []
    if res["locations"]:
        any_loc = next(iter(res["locations"].values()))
        nbytes = any_loc["bytes"]
        runs = any_loc["limit"]["write_GBps"]["runs"]
        lines += [f"ckpt benchmark{' (--quick)' if params.get('quick') else ''}: "
                  f"{nbytes / 2**30:.2f} GiB of float32 in {nbytes // 2**26} tensors of 64 MiB, "
                  f"{params['rounds']} rounds, {len(runs)} runs per figure; GB/s = 1e9 bytes/s; "
                  f"median [min - max]"]
    else:
        lines.append("ckpt benchmark: the PyTorch peers only")
    lines += ["machine: " + machine_line(mach, end_load), ""]
    for loc, L in res["locations"].items():
        base = params["locations"].get(loc, L["dir"])
        fs = mach.get("filesystems", {}).get(base, {})
        title = f"{LOCATION_TITLE[loc]} ({base}, {fs.get('fstype', '?')})"
        lines += render_rows(title, location_rows(loc, L)) + [""]
    if res["locations"]:
        lines.append("metadata")
        lines += metadata_rows(res["metadata"]) + [""]
        checks, tl = targets(res, params.get("quick"))
        res["targets"] = checks
        note = " (a --quick run: the targets are for 2 GiB)" if params.get("quick") else ""
        lines.append(f"targets{note}")
        lines += tl + [""]
    lines += torch_lines(raw, torch_res)
    text = "\n".join(lines) + "\n"

    # The flat keys of the /dev/shm run (headline: uncompressed, 4 ranks).
    shm = res["locations"].get("shm")
    if shm:
        res["limit_write_GBps"] = shm["limit"]["write_GBps"]["median"]
        res["limit_read_GBps"] = shm["limit"]["read_GBps"]["median"]
        res["memcpy_GBps"] = shm["limit"]["memcpy_GBps"]["median"]
        plain = [c for c in shm["ckpt"] if c["codec"] == "none" and c["io"] == "buffered"]
        ranks = max(c["ranks"] for c in plain)
        c = next(c for c in plain if c["ranks"] == ranks)
        res["headline_ranks"] = ranks
        res["ckpt_save_GBps"] = c["save_GBps"]["median"]
        res["ckpt_load_GBps"] = c["load_GBps"]["median"]
        res["ckpt_save_vs_limit"] = c["save_vs_limit"]["median"]
        res["ckpt_load_vs_limit"] = c["load_vs_limit"]["median"]
        for p, by in shm["peers"].items():
            if str(ranks) in by:
                res[f"{p}_save_GBps"] = by[str(ranks)]["save_GBps"]["median"]
                res[f"{p}_load_GBps"] = by[str(ranks)]["load_GBps"]["median"]

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "latest.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "latest.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")
    md = (lines[0] + "\n\nMachine: " + machine_line(mach, end_load) + "\n\n```\n"
          + "\n".join(lines[3:]) + "\n```\n")
    with open(os.path.join(out_dir, "latest.md"), "w") as f:
        f.write(md)
    if torch_md:
        with open(os.path.join(out_dir, "torch.md"), "w") as f:
            f.write(torch_md)
    sys.stdout.write(text)
    chart = chart_png(res, os.path.join(out_dir, "latest.png"))
    print(f"wrote {out_dir}/latest.txt, latest.json, latest.md{', torch.md' if torch_md else ''}"
          f"{', latest.png' if chart else ''}")
    if not chart:
        print("chart: not drawn (python3-matplotlib is not installed)")
    if readme and res["locations"]:
        update_readme(readme, md)
    if torch_readme and torch_md:
        update_readme(torch_readme, torch_md, TORCH_BEGIN, TORCH_END)


BEGIN, END = "<!-- latest run: begin -->", "<!-- latest run: end -->"
TORCH_BEGIN, TORCH_END = "<!-- torch peers: begin -->", "<!-- torch peers: end -->"


def update_readme(path, md, begin=BEGIN, end=END):
    text = open(path).read()
    a, b = text.find(begin), text.find(end)
    if a < 0 or b < a:
        raise SystemExit(f"{path}: no '{begin}' ... '{end}' markers")
    with open(path, "w") as f:
        f.write(text[: a + len(begin)] + "\n" + md + text[b:])
    print(f"updated {path}")


# ---- the PyTorch peers (bench/peers/pytorch.py) ----


def gather_torch(raw, mach, end_load):
    """(pytorch.py's JSON, its markdown table) or (None, None)."""
    p = os.path.join(raw, "torch.json")
    if not os.path.exists(p):
        return None, None
    import pytorch  # bench/peers/pytorch.py, beside this file
    res = load_json(p)
    cpu = f"{mach.get('cpu', '?')}, {mach.get('cores')} cores, {mach.get('ram_GiB')} GiB RAM"
    cmd = "scripts/bench --torch-only" + (f" --torch-gib {res['gib']:g}" if res["gib"] != 1 else "")
    return res, pytorch.markdown(res, machine=cpu, command=cmd)


def torch_lines(raw, res):
    if res is None:
        skip = os.path.join(raw, "torch.skip")
        if os.path.exists(skip):
            return [f"PyTorch peers: skipped ({open(skip).read().strip()})"]
        return []
    import pytorch
    la0, la1 = res["loadavg_start"][0], res["loadavg_end"][0]
    return [f"PyTorch peers (bench/peers/pytorch.py): {res['gib']:g} GiB, {res['runs']} runs per "
            f"figure; seconds, median [min-max]; load average {la0:.1f} at the start, "
            f"{la1:.1f} at the end", pytorch.render(res)]


def chart_png(res, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    locs = list(res["locations"].items())
    torch_panels = torch_chart_panels(res.get("torch"))
    rows = (1 if locs else 0) + (1 if torch_panels else 0)
    if rows == 0:
        return False
    cols = max(len(locs), len(torch_panels), 1)
    fig = plt.figure(figsize=(7 * cols, 5.5 * rows))
    for k, (loc, L) in enumerate(locs):
        ax = fig.add_subplot(rows, cols, k + 1)
        bars = [("limit\nwrite", L["limit"]["write_GBps"], "0.6"), ("limit\nread", L["limit"]["read_GBps"], "0.6")]
        for c in L["ckpt"]:
            tag = ("" if c["codec"] == "none" else " zstd") + (" direct" if c["io"] == "direct" else "")
            col = {"none": "tab:blue", "zstd": "tab:cyan"}[c["codec"]] if c["io"] == "buffered" else "tab:purple"
            bars.append((f"ckpt{tag}\nsave x{c['ranks']}", c["save_GBps"], col))
            bars.append((f"ckpt{tag}\nload x{c['ranks']}", c["load_GBps"], col))
        colors = {"h5py": "tab:green", "torch": "tab:red", "numpy": "tab:orange"}
        for p, by in L["peers"].items():
            for ranks, e in by.items():
                bars.append((f"{p}\nsave x{ranks}", e["save_GBps"], colors[p]))
                bars.append((f"{p}\nload x{ranks}", e["load_GBps"], colors[p]))
        xs = range(len(bars))
        med = [b[1]["median"] for b in bars]
        err = [[b[1]["median"] - b[1]["min"] for b in bars], [b[1]["max"] - b[1]["median"] for b in bars]]
        ax.bar(xs, med, yerr=err, color=[b[2] for b in bars], capsize=2)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b[0] for b in bars], rotation=90, fontsize=7)
        ax.set_ylabel("GB/s (median, bars: min-max)")
        ax.set_title(f"{LOCATION_TITLE[loc]}: {L['bytes'] / 2**30:.2f} GiB")
        ax.axhline(L["limit"]["write_GBps"]["median"], color="0.4", lw=0.8, ls="--", label="limit: write")
        ax.axhline(L["limit"]["read_GBps"]["median"], color="0.4", lw=0.8, ls=":", label="limit: read")
        ax.legend(loc="upper right", fontsize=7)
    first = (1 if locs else 0) * cols
    for k, (title, bars) in enumerate(torch_panels):
        ax = fig.add_subplot(rows, cols, first + k + 1)
        ys = range(len(bars))
        med = [b[1]["median"] for b in bars]
        err = [[b[1]["median"] - b[1]["min"] for b in bars], [b[1]["max"] - b[1]["median"] for b in bars]]
        ax.barh(ys, med, xerr=err, color=[torch_color(b[0]) for b in bars], capsize=2)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([b[0] for b in bars], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds (median, bars: min-max; shorter is better)")
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def torch_color(label):
    name = label.split(": ", 1)[-1]
    if name.startswith("limit"):
        return "0.6"
    if "ckpt" in name:
        return "tab:cyan" if "dcp+ckpt" in name else "tab:blue"
    if name.startswith("dcp"):
        return "tab:orange"
    if "safetensors" in name:
        return "tab:green"
    return "tab:red"  # torch.save


def torch_chart_panels(res):
    """[(title, [(label, stat), ...]), ...] of pytorch.py's figures."""
    if not res:
        return []
    panels = {}
    for r in res["rows"]:
        if r["s"] is None:
            continue
        sec = r["section"]
        if sec.startswith("resharded"):
            m = re.search(r"saved on (\d+), loaded on (\d+)", sec)
            title = f"resharded loads of the checkpoints saved on {m.group(1)} processes"
            layout, name = r["what"].split(None, 1)
            label = f"on {m.group(2)}, {layout}: {name}"
        elif sec.startswith("one process") or sec.startswith("consolidation"):
            title = "one process; consolidation to safetensors"
            op = "consolidate" if sec.startswith("consolidation") else " ".join(r["what"].split()[:-1])
            label = f"{op}: {r['what'].split()[-1] if not sec.startswith('consolidation') else r['what']}"
        else:
            title = sec
            w = r["what"]
            if w.startswith("async"):
                name, _, kind = w[len("async "):].rpartition(": ")
                label = f"async {kind}: {name}"
            else:
                op, _, name = w.partition("  ")
                label = f"{op}: {name.strip()}"
        panels.setdefault(title, []).append((label, r["s"]))
    return list(panels.items())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("machine")
    m.add_argument("--dirs", nargs="*", default=[])
    r = sub.add_parser("render")
    r.add_argument("--raw", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--readme")
    r.add_argument("--torch-readme", help="a file with the 'torch peers' markers (README.md)")
    args = ap.parse_args()
    if args.cmd == "machine":
        print(json.dumps(machine(args.dirs)))
    else:
        render(args.raw, args.out, args.readme, args.torch_readme)


if __name__ == "__main__":
    main()
