"""os.fork()s a child that trains a few steps of its own and leaves with sys.exit(5), as a forked
child may; the parent waits for it, then trains. Only the parent may report."""
import os
import sys

from _loop import setup, step

model, opt, loader = setup()
pid = os.fork()
if pid == 0:
    for i, (x, y) in enumerate(loader):
        step(model, opt, x, y)
        if i == 30:  # past diagnose's step limit: the child's steps must not count or stop it
            break
    print(f"child {os.getpid()} trained 31 steps", flush=True)
    sys.exit(5)
_, status = os.waitpid(pid, 0)
print(f"parent saw child status {os.waitstatus_to_exitcode(status)}", flush=True)
for epoch in range(2):
    for x, y in loader:
        step(model, opt, x, y)
