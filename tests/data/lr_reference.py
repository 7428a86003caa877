# Generates the expected learning rates in tests/test_optim.c's
# test_lr_schedules with torch.optim.lr_scheduler (run:
# /usr/bin/python3 tests/data/lr_reference.py): the lr before the first
# step() and after each of 12 steps, base lr 0.1.
import torch

cases = [
    ("step", lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)),
    ("multistep", lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1)),
    ("exponential", lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)),
    ("cosine", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.001)),
    ("linear", lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=4)),
]
for name, make in cases:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    s = make(opt)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(12):
        opt.step()
        s.step()
        lrs.append(opt.param_groups[0]["lr"])
    vals = ["%.17g" % v for v in lrs]
    print("    {\"%s\"," % name)
    for i in range(0, len(vals), 4):
        last = i + 4 >= len(vals)
        print("     %s%s%s" % ("{" if i == 0 else " ", ", ".join(vals[i:i + 4]), "}}," if last else ","))
