#!/usr/bin/env python3
"""Proves that tests/reliability/power_loss_test.cc bites: removes each fsync
of the commit path (F1-F9 of spec/FORMAT.md section 4.1) from the source,
one at a time, rebuilds reliability_power_loss_test, runs it, restores the
source, and prints whether the test failed (it must, for every fsync) with
its first failure.

  tests/reliability/fsync_mutations.py [BUILD_DIR] [F1 F5 ...]

BUILD_DIR (default build/) must be a configured build tree of this
checkout. Not run by CI; takes a few minutes on 2 cores. The source files
are edited in place and restored, also on errors and Ctrl-C: do not edit
libckpt/ while it runs.
"""
import os, re, subprocess, sys

W = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
args = sys.argv[1:]
BUILD = 'build'
if args and not re.match(r'F\d$', args[0]):
    BUILD = args.pop(0)
cases = {
 'F1 parent fsync after creating the root (EnsureRoot)': ('libckpt/save/commit.cc', '  return storage->SyncDir(ParentDir(root));', '  (void)&ParentDir;\n  return absl::OkStatus();'),
 'F2 shard file fsync (FinishShard)': ('libckpt/save/shard_writer.cc', '  CKPT_RETURN_IF_ERROR(file->Sync());  // F2 of spec/FORMAT.md §4.1\n', ''),
 'F3 MANIFEST fsync (CommitCheckpoint)': ('libckpt/storage/storage.cc', '  CKPT_RETURN_IF_ERROR(file->Sync());', '  if (path.find("MANIFEST") == std::string::npos) CKPT_RETURN_IF_ERROR(file->Sync());'),
 'F4 temporary directory fsync (CommitCheckpoint)': ('libckpt/save/commit.cc', '  CKPT_RETURN_IF_ERROR(storage->SyncDir(tmp));\n', ''),
 'F5 root fsync after rename (CommitDir)': ('libckpt/save/commit.cc', '  // F5: the checkpoint is committed.\n  CKPT_RETURN_IF_ERROR(storage->SyncDir(root));\n', ''),
 'F6 latest temp file fsync (UpdateLatest)': ('libckpt/storage/storage.cc', '  CKPT_RETURN_IF_ERROR(file->Sync());', '  if (path.find("latest-") == std::string::npos) CKPT_RETURN_IF_ERROR(file->Sync());'),
 'F7 root fsync after latest rename (UpdateLatest)': ('libckpt/save/commit.cc', '  // F7.\n  return storage->SyncDir(root);', '  return absl::OkStatus();'),
 'F8 step directory fsync after MANIFEST unlink (PruneOld)': ('libckpt/save/commit.cc', '    // F8.\n    CKPT_RETURN_IF_ERROR(storage->SyncDir(dir));\n', ''),
 'F9 root fsync after pruning (PruneOld)': ('libckpt/save/commit.cc', '  // F9.\n  return storage->SyncDir(root);', '  return absl::OkStatus();'),
}
only = args
for name,(f,old,new) in cases.items():
    if only and not any(name.split(' ')[0] == o for o in only): continue
    p=f'{W}/{f}'
    src=open(p).read()
    assert src.count(old)==1, (name, src.count(old))
    open(p,'w').write(src.replace(old,new))
    try:
        b=subprocess.run(['ninja','-C',BUILD,'-j2','reliability_power_loss_test'],cwd=W,capture_output=True,text=True)
        if b.returncode: print(name, 'BUILD FAILED', b.stdout[-2000:]); continue
        r=subprocess.run([os.path.join(BUILD,'tests','reliability_power_loss_test')],cwd=W,capture_output=True,text=True)
        failed=[l.split('] ')[1].split(' ')[0] for l in r.stdout.splitlines() if l.startswith('[  FAILED  ] PowerLoss')]
        failed=sorted(set(failed))
        first=''
        m=re.search(r'Failure\n(.*?)Google Test trace:\n[^\n]*?: (power cut[^\n]*)', r.stdout, re.S)
        if m: first=(' / '.join(m.group(1).strip().splitlines())[:400] + '\n    at: ' + m.group(2))
        print(f'{name}: {"FAILS" if r.returncode else "PASSES"}; failing tests: {", ".join(failed)}\n    first: {first}', flush=True)
    finally:
        open(p,'w').write(src)
subprocess.run(['ninja','-C',BUILD,'-j2','reliability_power_loss_test'],cwd=W,capture_output=True)
