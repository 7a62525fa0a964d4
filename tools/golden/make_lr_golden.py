#!/usr/bin/env python3
"""Write tests/golden/lr_schedules.txt: learning rates that torch.optim.lr_scheduler
gives, for tests/test_api.c to compare with dp_lr_at.

Each line: kind base_lr step_size gamma warmup start_factor t_max eta_min t lr
(kind: 0 constant, 1 step, 2 cosine, 3 warmup-cosine, as dp_lr_kind); lr is
optimizer.param_groups[0]["lr"] after t calls of scheduler.step(), printed with
17 significant digits. Usage: /usr/bin/python3 tools/golden/make_lr_golden.py
Needs python3-torch (Debian's 1.13 is fine).
"""
import os
import warnings

import torch

warnings.filterwarnings("ignore")  # scheduler.step() before optimizer.step()

CASES = [
    # kind, base_lr, step_size, gamma, warmup, start_factor, t_max, eta_min, steps
    (0, 0.01, 0, 0.0, 0, 0.0, 0, 0.0, 5),
    (1, 0.1, 3, 0.5, 0, 0.0, 0, 0.0, 12),
    (1, 0.003, 1, 0.9, 0, 0.0, 0, 0.0, 20),
    (2, 0.1, 10, 0.0, 0, 0.0, 10, 0.0, 25),
    (2, 0.05, 7, 0.0, 0, 0.0, 7, 0.001, 16),
    (3, 0.003, 0, 0.0, 5, 1.0 / 3.0, 20, 0.0, 30),
    (3, 0.1, 0, 0.0, 2, 0.1, 6, 0.01, 12),
]


def schedule(opt, c):
    kind, base, step_size, gamma, warmup, start, t_max, eta_min, _ = c
    S = torch.optim.lr_scheduler
    if kind == 0:
        return S.ConstantLR(opt, factor=1.0, total_iters=0)
    if kind == 1:
        return S.StepLR(opt, step_size=step_size, gamma=gamma)
    if kind == 2:
        return S.CosineAnnealingLR(opt, T_max=t_max, eta_min=eta_min)
    warm = S.LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=warmup)
    cos = S.CosineAnnealingLR(opt, T_max=t_max, eta_min=eta_min)
    return S.SequentialLR(opt, [warm, cos], milestones=[warmup])


def main():
    out = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden",
                       "lr_schedules.txt")
    lines = ["# written by tools/golden/make_lr_golden.py with torch %s" % torch.__version__]
    for c in CASES:
        # the rate as float32, as libdp's config holds it
        base = float(torch.tensor(c[1], dtype=torch.float32))
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=base)
        sch = schedule(opt, c)
        for t in range(c[8] + 1):
            lr = opt.param_groups[0]["lr"]
            lines.append("%d %.9g %d %.9g %d %.9g %d %.9g %d %.17g" %
                         (c[0], base, c[2], c[3], c[4], c[5], c[6], c[7], t, lr))
            sch.step()
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote %s (%d rates)" % (out, len(lines) - 1))


if __name__ == "__main__":
    main()
