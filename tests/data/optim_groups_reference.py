# Generates the expected values in tests/test_optim_groups.c with
# torch.optim param_groups (run: /usr/bin/python3
# tests/data/optim_groups_reference.py).  Three parameters "0.weight" (4),
# "0.bias" (2), "1.weight" (3), initial values and gradients from the
# formulas below (exact in float32, the C test computes the same), five
# steps; prints all 9 values after the last step for each configuration.
import torch

SIZES = [("0.weight", 4), ("0.bias", 2), ("1.weight", 3)]
STEPS = 5


def p0(k, i):
    return ((k * 5 + i * 3) % 7 - 3) / 8.0


def grad(s, k, i):
    return ((s * 13 + k * 5 + i * 7) % 11 - 5) / 4.0


def run(cls, kw, groups, added=None):
    ps = [torch.nn.Parameter(torch.tensor([p0(k, i) for i in range(n)], dtype=torch.float32))
          for k, (_, n) in enumerate(SIZES)]
    pg = [dict(g, params=[ps[k] for k in g["params"]]) for g in groups]
    opt = getattr(torch.optim, cls)(pg, **kw)
    if added is not None:
        opt.add_param_group(dict(added, params=[ps[k] for k in added["params"]]))
    for s in range(STEPS):
        for k, (_, n) in enumerate(SIZES):
            ps[k].grad = torch.tensor([grad(s, k, i) for i in range(n)], dtype=torch.float32)
        opt.step()
    return [v for p in ps for v in p.detach().tolist()]


cases = [
    ("sgd no decay on biases", run("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01),
                                   [dict(params=[1], weight_decay=0.0, lr=0.05), dict(params=[0, 2])])),
    ("adam betas per group", run("Adam", dict(lr=0.01, weight_decay=0.1),
                                 [dict(params=[0], betas=(0.8, 0.999)), dict(params=[1])],
                                 added=dict(params=[2], lr=0.05, betas=(0.9, 0.9)))),
    ("rmsprop momentum in one group", run("RMSprop", dict(lr=0.01),
                                          [dict(params=[0, 1], momentum=0.9), dict(params=[2])])),
    ("adadelta lr per group", run("Adadelta", dict(weight_decay=0.1),
                                  [dict(params=[0, 2]), dict(params=[1], lr=0.5, weight_decay=0.0)])),
]
for name, vals in cases:
    print("    {\"%s\", {%s}}," % (name, ", ".join("%.9ef" % v for v in vals)))
