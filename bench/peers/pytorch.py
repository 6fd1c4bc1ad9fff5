#!/usr/bin/env python3
"""ckpt next to the checkpointers PyTorch users have (DCP sync and async,
safetensors, torch.save), on PyTorch state, in one run.

    PYTHONPATH=build/python .venv/bin/python bench/peers/pytorch.py \
        [--gib 1] [--runs 5] [--ranks 2,4] [--reshard-to 2,3] [--leak-saves 20] \
        [--shm /dev/shm/ckpt-torch-peers] [--disk DIR] [--bin build/bin]

Runs, one after the other, each as its own processes:
  fsdp2.py same --ranks R        for R in --ranks: save, load, async save of
                                 an FSDP2 + AdamW state (the first R also
                                 flips a byte in each checkpoint:
                                 --integrity; the last R saves the
                                 checkpoints of the next two jobs and runs
                                 the --leak-saves consecutive async saves)
  fsdp2.py reshard --ranks R'    for R' in --reshard-to: loads of what the
                                 last R saved, into FSDP2 and TP layouts
  single.py                      one process: safetensors vs ckpt on /dev/shm
                                 (warm) and on --disk (cold and warm), and the
                                 consolidation of the last R's model to
                                 Hugging Face safetensors (DCP vs
                                 ckpt-convert), and the integrity check of both
Contenders are interleaved run by run inside each job, so a ratio of two
medians of one job compares like with like on a busy machine. The targets
of issue 24 are checked on those ratios. A contender that cannot run is
reported as skipped with the reason; nothing is estimated.

Prints each job's progress, then a table, then the targets; the last line is
one JSON object:
  gib, runs, ranks, reshard_to, cores, versions, seconds
  loadavg_start, loadavg_end   /proc/loadavg (1, 5, 15 min) around the run
  same[]       per --ranks: save_s / load_s {contender: [s per run]},
               async {contender: {blocked_s, durable_s}}, rss {contender:
               {before, after_first, after_last, peak (bytes, sum of ranks),
               saves, *_vs_state}}, integrity {contender: {outcome, message
               or wrong_tensors, file, offset, tensor}}, skipped {name: why}
  reshard[]    per --reshard-to: layouts {fsdp2|tp: {contender: {load_s,
               rchar_bytes, ckpt_bytes_read, read_vs_checkpoint}}},
               checkpoint_bytes {dcp, ckpt}
  single       single {shm|disk: {contender: {save_s, load_warm_s,
               load_cold_s}}}, consolidation {results {contender: [s]}},
               integrity
  rows[]       {section, what, s {median, min, max, runs}, note}: the table
  targets[]    {what, ckpt, value, goal, kind, met, note (a bound), and for
               a comparison peer, ckpt_s and peer_s}
  skipped      {what: why}
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def stat(v):
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": list(v)}


def run_job(cmd, say):
    """Runs a job, shows its progress indented; returns its last line's JSON."""
    say("  $ " + " ".join(os.path.relpath(c) if c.startswith(HERE) else c for c in cmd[1:]))
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    last, tail = None, []
    for line in p.stdout:
        line = line.rstrip("\n")
        if not line:
            continue
        if line.startswith("{"):
            last = line
            continue
        if "Warning" in line or line.startswith("  warnings.warn"):
            continue
        tail = (tail + [line])[-40:]
        say("    " + line)
    rc = p.wait()
    if rc != 0 or last is None:
        raise RuntimeError(f"{' '.join(cmd)}: exit status {rc}\n" + "\n".join(tail))
    say(f"    ({time.time() - t0:.0f} s)")
    return json.loads(last)


# ---- the table and the targets ---------------------------------------------------


def med(v):
    return statistics.median(v) if v else None


def cpu_note(v):
    return f"CPU {med(v):.2f} s" if v else ""


def rows_and_targets(res):
    """Rows (section, what, stat of seconds, note) of every figure, and the
    comparisons of ckpt with its peers (the targets of issue 24 among
    them): ratios of medians of one job."""
    rows, checks = [], []

    def row(section, what, values, note=""):
        rows.append({"section": section, "what": what, "s": stat(values), "note": note})

    def note_row(section, what, note):
        rows.append({"section": section, "what": what, "s": None, "note": note})

    def compare(what, ck, ck_vals, peer, peer_vals, goal, lower_is_better=False, extra="",
                bound_vals=None):
        """ckpt's ck_vals against peer's: for times, peer median / ckpt
        median >= goal (a speed-up); lower_is_better: ckpt / peer <= goal.
        bound_vals: the times of what any contender must do at least (a
        limit of the same run); its ratio to the peer's is the check's
        "bound", the best value ckpt can reach."""
        c, p = stat(ck_vals), stat(peer_vals)
        if c is None or p is None or not c["median"] or not p["median"]:
            return
        value = c["median"] / p["median"] if lower_is_better else p["median"] / c["median"]
        met = value <= goal if lower_is_better else value >= goal
        check = {"what": what, "ckpt": ck, "ckpt_s": c, "peer": peer, "peer_s": p,
                 "value": round(value, 3), "goal": goal,
                 "kind": "at most" if lower_is_better else "at least",
                 "met": met, "note": extra}
        if bound_vals and med(bound_vals):
            b = med(bound_vals) / p["median"] if lower_is_better else p["median"] / med(bound_vals)
            check["bound"] = round(b, 3)
        checks.append(check)

    def bound(limit, peer, peer_name, how):
        """compare's arguments for a format-free copy of the bytes (`limit`,
        its times) next to the peer: the note that says what it takes, and
        its times as the check's bound."""
        if not limit or not peer:
            return {}
        return {"extra": f"bound: {how} of the bytes alone (no format, no checksum) takes "
                         f"{med(limit):.3f} s, so {med(peer) / med(limit):.2f}x {peer_name} is "
                         "the most a format that copies each byte once can reach",
                "bound_vals": limit}

    def best(d):
        d = {n: v for n, v in d.items() if v}
        return min(d, key=lambda n: med(d[n])) if d else None

    for job in res["same"]:
        r = job["ranks"]
        sec = f"{r} processes, FSDP2 + AdamW {job['state_bytes'] / 2**30:.2f} GiB"
        save, load = job["save_s"], job["load_s"]
        for name in load:
            if name in save:
                row(sec, f"save  {name}", save[name], cpu_note(job.get("save_cpu_s", {}).get(name)))
        for name in load:
            row(sec, f"load  {name}", load[name], cpu_note(job.get("load_cpu_s", {}).get(name)))
        for name, a in job["async"].items():
            row(sec, f"async {name}: blocked", a["blocked_s"])
            row(sec, f"async {name}: durable", a["durable_s"])
        dcp_save = best({n: v for n, v in save.items() if n.startswith("dcp") and "ckpt" not in n})
        dcp_load = best({n: v for n, v in load.items() if n.startswith("dcp") and "ckpt" not in n})
        if dcp_save:
            compare(f"{r} proc: save, >= 1.0x DCP's best", "ckpt.torch", save.get("ckpt.torch"),
                    dcp_save, save[dcp_save], 1.0)
            compare(f"{r} proc: save through DCP's API, >= 1.0x DCP's best", "dcp+ckpt",
                    save.get("dcp+ckpt"), dcp_save, save[dcp_save], 1.0)
        compare(f"{r} proc: save, >= 2x torch.save", "ckpt.torch", save.get("ckpt.torch"),
                "torch.save", save.get("torch.save"), 2.0,
                **bound(save.get("limit"), save.get("torch.save"), "torch.save", "write(2)"))
        if dcp_load:
            for ck in ("ckpt.torch", "ckpt indep.", "dcp+ckpt"):
                compare(f"{r} proc: load ({ck}), >= 1.5x dcp.load's best", ck, load.get(ck),
                        dcp_load, load[dcp_load], 1.5)
        compare(f"{r} proc: load, >= 2x torch.load", "ckpt.torch", load.get("ckpt.torch"),
                "torch.load", load.get("torch.save"), 2.0,
                **bound(load.get("limit"), load.get("torch.save"), "torch.load", "readinto(2)"))
        a = job["async"]
        dcp_async = {n: x for n, x in a.items() if n.startswith("dcp.async")}
        for ck in ("ckpt.torch async", "dcp+ckpt async"):
            if ck not in a or not dcp_async:
                continue
            b = best({n: x["blocked_s"] for n, x in dcp_async.items()})
            d = best({n: x["durable_s"] for n, x in dcp_async.items()})
            peer = med(dcp_async[b]["blocked_s"])
            figures = [f"{how} takes {med(a[n]['blocked_s']):.3f} s = "
                       f"{med(a[n]['blocked_s']) / peer:.2f}x {b}'s blocked time"
                       for n, how in (("limit: state dict + ckpt copy", "get_state_dict and "
                                       "ckpt's snapshot copy of the bytes alone (the bound of "
                                       "a snapshot through DCP's state-dict API)"),
                                      ("limit: memcpy", "for scale, one copy_ (torch's, "
                                       "ordinary stores) of the state"))
                       if n in a]
            lim = a.get("limit: state dict + ckpt copy", {}).get("blocked_s")
            compare(f"{r} proc: async ({ck}) blocked, <= 0.8x dcp.async_save's best", ck,
                    a[ck]["blocked_s"], b, dcp_async[b]["blocked_s"], 0.8, lower_is_better=True,
                    extra="; ".join(figures), bound_vals=lim)
            compare(f"{r} proc: async ({ck}) durable, <= 1.0x DCP's best", ck,
                    a[ck]["durable_s"], d, dcp_async[d]["durable_s"], 1.0, lower_is_better=True)
        for name, m in job.get("rss", {}).items():
            growth = (m["after_last"] - m["after_first"]) / job["state_bytes"]
            resident = (m["after_first"] - m["before"]) / job["state_bytes"]
            peak = (m["peak"] - m["before"]) / job["state_bytes"]
            m.update(growth_vs_state=round(growth, 4), resident_vs_state=round(resident, 4),
                     peak_vs_state=round(peak, 4))
            note_row(sec, f"RSS   {name}, {m['saves']} async saves",
                     f"sum over processes: {growth:+.1%} of the state from the 1st save to the "
                     f"last; {resident:+.0%} after the 1st; peak {peak:+.0%} (VmHWM)")
            if name == "ckpt.torch async":
                checks.append({"what": f"{r} proc: RSS growth over {m['saves']} async saves, <= 2% "
                                       "of the state", "ckpt": name, "value": round(growth, 4),
                               "goal": 0.02, "kind": "at most", "met": growth <= 0.02,
                               "note": "DCP: " + ", ".join(
                                   f"{n} {(x['after_last'] - x['after_first']) / job['state_bytes']:+.1%}"
                                   for n, x in job["rss"].items() if n.startswith("dcp"))})
        for name, why in job.get("skipped", {}).items():
            note_row(sec, f"skipped: {name}", why)

    for job in res["reshard"]:
        sizes = job["checkpoint_bytes"]
        sec = (f"resharded load, saved on {job['from_ranks']}, loaded on {job['ranks']} processes"
               f" (checkpoints: dcp {sizes['dcp'] / 2**20:.0f} MiB, ckpt {sizes['ckpt'] / 2**20:.0f} MiB)")
        for layout, by in job["layouts"].items():
            for name, e in by.items():
                size = sizes["dcp" if name == "dcp" else "ckpt"]
                e["read_vs_checkpoint"] = round(med(e["rchar_bytes"]) / size, 3)
                note = (cpu_note(e.get("load_cpu_s")) +
                        f"; read {e['read_vs_checkpoint']:.2f}x the checkpoint (rchar)")
                if e.get("ckpt_bytes_read"):
                    note += f", {med(e['ckpt_bytes_read']) / size:.2f}x (ckpt's bytes_read)"
                row(sec, f"{layout:5s} {name}", e["load_s"], note)
            d = by.get("dcp")
            if not d:
                continue
            tag = f"reshard {job['from_ranks']}->{job['ranks']} {layout}"
            for ck in ("ckpt.torch", "ckpt indep."):
                if ck not in by:
                    continue
                read = by[ck]["read_vs_checkpoint"]
                # The bytes target is the resharded load's, ckpt's default
                # (cooperative) one's; a load over a group of one rank (the
                # option a job takes to skip its collectives) reads every
                # block each rank uses whole, as its checksum covers the
                # block: reported next to its time, not judged.
                compare(f"{tag} ({ck}): time, <= 0.5x DCP's", ck, by[ck]["load_s"], "dcp",
                        d["load_s"], 0.5, lower_is_better=True,
                        extra="" if ck == "ckpt.torch" else
                        f"reads {read:.3f}x the checkpoint (each rank alone reads every block "
                        f"it uses whole); DCP {d['read_vs_checkpoint']:.2f}x")
                if ck != "ckpt.torch":
                    continue
                checks.append({"what": f"{tag} ({ck}): bytes read, <= 1.05x the checkpoint",
                               "ckpt": ck, "value": read, "goal": 1.05, "kind": "at most",
                               "met": read <= 1.05,
                               "note": f"DCP reads {d['read_vs_checkpoint']:.2f}x its checkpoint"})
        for name, why in job.get("skipped", {}).items():
            note_row(sec, f"skipped: {name}", why)

    single = res.get("single")
    if single:
        sec = f"one process, {single['state_bytes'] / 2**30:.2f} GiB of plain tensors"
        for loc, by in single["single"].items():
            for name, r in by.items():
                if name in ("dir", "cpu"):
                    continue
                for k, v in r.items():
                    row(sec, f"{loc:4s} {k[:-2].replace('_', ' '):9s} {name}", v,
                        cpu_note(by.get("cpu", {}).get(name, {}).get(k)))
            st, ck, lim = by.get("safetensors"), by.get("ckpt.torch"), by.get("limit", {})
            if st and ck:
                for k in ck:
                    op = k[:-2].replace("_", " ")
                    compare(f"one process, {loc}: {op}, >= 1.0x safetensors", "ckpt.torch", ck[k],
                            "safetensors", st.get(k), 1.0,
                            **bound(lim.get(k), st.get(k), "safetensors",
                                    "write(2)" if k == "save_s" else "readinto(2)"))
        con = single.get("consolidation")
        if con:
            csec = (f"consolidation to one Hugging Face safetensors file of the model saved on "
                    f"{con['from_ranks']} processes ({con['model_bytes'] / 2**20:.0f} MiB)")
            for name, v in con["results"].items():
                row(csec, name, v, cpu_note(con.get("cpu_s", {}).get(name)))
            b = best({n: v for n, v in con["results"].items() if n.startswith("dcp")})
            if b:
                compare("consolidation to safetensors, >= 2x DCP's", "ckpt-convert",
                        con["results"].get("ckpt-convert"), b, con["results"][b], 2.0,
                        **(bound(con["results"].get("limit: copy"), con["results"][b], b,
                                 "pread(2) of the checkpoint on one thread and write(2) "
                                 "of the output on another")
                           or bound(con["results"].get("limit"), con["results"][b], b,
                                    "write(2) of the output")))
    return rows, checks


def integrity_rows(res):
    out = []
    for job in res["same"]:
        for name, r in job.get("integrity", {}).items():
            out.append((f"{name} ({job['ranks']} processes)", r))
    for name, r in (res.get("single") or {}).get("integrity", {}).items():
        out.append((f"{name} (one process)", r))
    return out


def render(res):
    rows, checks = res["rows"], res["targets"]
    lines = []
    section = None
    for r in rows:
        if r["section"] != section:
            section = r["section"]
            lines.append(section)
        s = r["s"]
        fig = (f"{s['median']:8.3f} s [{s['min']:.3f}-{s['max']:.3f}]" if s else "")
        lines.append(f"  {r['what']:42s} {fig:28s} {r['note']}".rstrip())
    lines.append("integrity: one byte flipped in a saved tensor, then loaded")
    for name, r in integrity_rows(res):
        msg = f": {r['message'][:110]}" if "message" in r else (
            f": {', '.join(r.get('wrong_tensors', []))}" if r.get("wrong_tensors") else "")
        lines.append(f"  {name:32s} {r['outcome']}{msg}")
    lines.append("targets (ratios of medians of one job)")
    for c in checks:
        if "peer" in c:
            v = (f"{c['value']:.2f} (ckpt {c['ckpt']} {c['ckpt_s']['median']:.3f} s, "
                 f"{c['peer']} {c['peer_s']['median']:.3f} s)")
        else:
            v = f"{c['value']:.3f}"
        lines.append(f"  {'met   ' if c['met'] else 'MISSED'}  {c['what']}: {v}{bounded(c)}"
                     + (f"; {c['note']}" if c.get("note") else ""))
    return "\n".join(lines)


def subject(what):
    """A target's text without its goal ("2 proc: save, >= 1.0x ..." -> "2 proc: save")."""
    return re.split(r", (?:>=|<=) ", what)[0]


def _s(s):
    return f"{s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]"


def reachable(c) -> bool:
    """Whether a check's bound (the best value its limit leaves) meets its goal."""
    b = c.get("bound")
    return b is None or (b <= c["goal"] if c["kind"] == "at most" else b >= c["goal"])


def bounded(c) -> str:
    """' (bound B)' after a missed target whose goal is out of reach in
    this run: what the same run's limit leaves at best."""
    if c["met"] or reachable(c):
        return ""
    unit = "" if "peer" not in c else "x"
    return f" (bound {c['bound']:.2f}{unit})"


def markdown(res, machine="", command="scripts/bench --torch-only"):
    """The README's table: each comparison of ckpt with a peer (medians and
    ranges of the last run), then what each does with a flipped byte."""
    la0, la1 = res["loadavg_start"], res["loadavg_end"]
    out = [f"{res['gib']:g} GiB of FSDP2-sharded transformer state with AdamW (bf16 and fp32, "
           f"generated at run time) on {', '.join(map(str, res['ranks']))} gloo processes on "
           f"/dev/shm, {res['runs']} runs per figure, contenders interleaved run by run; "
           "seconds, median [min-max]; each load checked bit for bit. "
           f"Machine: {machine or str(res['cores']) + ' cores'}; load average (1 min) "
           f"{la0[0]:.1f} at the start, {la1[0]:.1f} at the end. torch "
           f"{res.get('versions', {}).get('torch', '?')}"
           + (f", safetensors {res['single']['versions']['safetensors']}" if res.get("single") else "")
           + f". Reproduce: `{command}`.", "",
           "| what | ckpt | s | peer | s | ckpt | target |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in res["targets"]:
        if "peer" in c:
            if c["kind"] == "at least":
                adv = f"{c['value']:.2f}x as fast"
                goal = f">= {c['goal']:g}x"
            else:
                adv = f"{c['value']:.2f}x the peer's time"
                goal = f"<= {c['goal']:g}x"
            if c.get("note", "").startswith("reads "):  # what it read, not judged
                adv += f" ({c['note']})"
            cells = [subject(c["what"]), c["ckpt"], _s(c["ckpt_s"]), c["peer"], _s(c["peer_s"]),
                     adv]
        else:
            goal = f"<= {c['goal']:g}"
            cells = [subject(c["what"]), c["ckpt"], "", "", "",
                     f"{c['value']:.3f}" + (f" ({c['note']})" if c.get("note") else "")]
        cells.append(f"{goal}: {'met' if c['met'] else '**missed**'}{bounded(c)}")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "One byte flipped in the middle of the stored bytes of rank 0's piece of "
            "`model.layers.0.up.weight`, then the checkpoint loaded by its own loader:", "",
            "| checkpoint | what the load did |", "| --- | --- |"]
    for name, r in integrity_rows(res):
        what = r["outcome"]
        if "message" in r:
            # Paths shortened to their last two parts (the run's directory
            # is a temporary one), DCP's wrapper cut to the error it carries.
            msg = re.sub(r"/[^\s:']*/([^/\s:']+/[^/\s:']+)", r".../\1", r["message"])
            what += f": `{msg[:240]}`"
        elif r.get("wrong_tensors"):
            what += ": " + ", ".join(f"`{t}`" for t in r["wrong_tensors"])
        out.append(f"| {name} | {what} |")
    skipped = {}
    for n, why in [(n, why) for job in res["same"] + res["reshard"]
                   for n, why in job.get("skipped", {}).items()] + list(res["skipped"].items()):
        skipped.setdefault(n, why)
    if skipped:
        out += ["", "Skipped: " + "; ".join(f"{n} ({why})" for n, why in skipped.items()) + "."]
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--reshard-to", default="2,3")
    p.add_argument("--leak-saves", type=int, default=20)
    p.add_argument("--shm", default="/dev/shm/ckpt-torch-peers")
    p.add_argument("--disk", help="a directory on a disk for the cold loads (none: skipped)")
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()

    def say(s):
        print(s, flush=True)

    ranks = [int(x) for x in args.ranks.split(",") if x]
    reshard_to = [int(x) for x in args.reshard_to.split(",") if x]
    py = args.python
    keep = os.path.join(args.shm, "keep")
    res = {"gib": args.gib, "runs": args.runs, "ranks": ranks, "reshard_to": reshard_to,
           "cores": os.cpu_count(), "loadavg_start": loadavg(), "same": [], "reshard": [],
           "skipped": {}}
    # Versions from the installed distributions: this process never imports
    # torch (the jobs do).
    from importlib import metadata
    res["versions"] = {"python": sys.version.split()[0]}
    try:
        res["versions"]["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError as e:
        res["skipped"]["all"] = f"torch is not installed: {e}"
    t0 = time.time()
    os.makedirs(args.shm, exist_ok=True)
    try:
        if "all" not in res["skipped"]:
            for i, r in enumerate(ranks):
                cmd = [py, os.path.join(HERE, "fsdp2.py"), "same", "--ranks", str(r), "--gib",
                       str(args.gib), "--runs", str(args.runs), "--dir",
                       os.path.join(args.shm, f"same-{r}"), "--bin", args.bin]
                if i == 0:
                    cmd.append("--integrity")
                if i == len(ranks) - 1:
                    cmd += ["--keep", keep, "--leak-saves", str(args.leak_saves)]
                say(f"save, load and async save on {r} processes")
                res["same"].append(run_job(cmd, say))
            for r in reshard_to:
                say(f"resharded load: saved on {ranks[-1]}, loaded on {r} processes")
                res["reshard"].append(run_job(
                    [py, os.path.join(HERE, "fsdp2.py"), "reshard", "--ranks", str(r),
                     "--runs", str(args.runs), "--dir", os.path.join(args.shm, f"reshard-{r}"),
                     "--src", keep], say))
            say("one process: safetensors vs ckpt; consolidation to safetensors")
            cmd = [py, os.path.join(HERE, "single.py"), "--gib", str(args.gib), "--runs",
                   str(args.runs), "--shm-dir", os.path.join(args.shm, "single"), "--consolidate",
                   keep, "--bin", args.bin, "--integrity"]
            if args.disk:
                cmd += ["--disk-dir", args.disk]
            else:
                res["skipped"]["cold loads"] = "no --disk directory (on /dev/shm files are memory)"
            res["single"] = run_job(cmd, say)
    finally:
        shutil.rmtree(args.shm, ignore_errors=True)
    res["seconds"] = round(time.time() - t0, 1)
    res["loadavg_end"] = loadavg()
    res["rows"], res["targets"] = rows_and_targets(res)
    say("")
    say(f"PyTorch peers: {args.gib} GiB, {args.runs} runs per figure, {os.cpu_count()} cores, "
        f"load average {res['loadavg_start'][0]:.1f} at the start, {res['loadavg_end'][0]:.1f} at "
        f"the end; {res['seconds']:.0f} s")
    say(render(res))
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
