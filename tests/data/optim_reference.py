# Generates the expected values in tests/test_optim.c with torch.optim
# (run: /usr/bin/python3 tests/data/optim_reference.py > /tmp/expect.h).
# Five parameters, four steps with fixed gradients (large, then small, so
# that amsgrad's running maximum matters); prints the parameters after each
# step for every configuration.
import torch

P0 = [0.5, -1.2, 2.0, 0.0, -0.3]
G = [[1.0, -2.0, 0.5, 3.0, -0.1],
     [0.2, 0.1, -0.4, 0.05, 0.3],
     [-0.01, 0.02, 0.03, -0.04, 0.05],
     [0.5, 0.5, -0.5, -0.5, 0.0]]

configs = [
    ("SGD", "sgd plain", dict(lr=0.1)),
    ("SGD", "sgd momentum", dict(lr=0.1, momentum=0.9)),
    ("SGD", "sgd dampening wd", dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("SGD", "sgd nesterov wd", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05)),
    ("SGD", "sgd maximize", dict(lr=0.1, momentum=0.5, weight_decay=0.1, maximize=True)),
    ("Adam", "adam defaults", dict(lr=0.01)),
    ("Adam", "adam wd betas eps", dict(lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)),
    ("Adam", "adam amsgrad", dict(lr=0.05, amsgrad=True)),
    ("Adam", "adam all", dict(lr=0.05, weight_decay=0.2, amsgrad=True, maximize=True)),
    ("AdamW", "adamw defaults", dict(lr=0.01)),
    ("AdamW", "adamw wd amsgrad", dict(lr=0.05, weight_decay=0.1, amsgrad=True)),
    ("AdamW", "adamw maximize", dict(lr=0.05, betas=(0.7, 0.95), weight_decay=0.3, maximize=True)),
    ("Adadelta", "adadelta defaults", dict()),
    ("Adadelta", "adadelta rho eps wd", dict(lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.1)),
    ("Adadelta", "adadelta maximize", dict(lr=2.0, weight_decay=0.05, maximize=True)),
    ("RMSprop", "rmsprop defaults", dict()),
    ("RMSprop", "rmsprop momentum wd", dict(lr=0.01, alpha=0.9, eps=1e-6, momentum=0.9, weight_decay=0.1)),
    ("RMSprop", "rmsprop centered", dict(lr=0.02, centered=True)),
    ("RMSprop", "rmsprop all", dict(lr=0.01, alpha=0.8, momentum=0.5, centered=True, weight_decay=0.2, maximize=True)),
]

for cls, name, kw in configs:
    p = torch.nn.Parameter(torch.tensor(P0, dtype=torch.float32))
    opt = getattr(torch.optim, cls)([p], **kw)
    rows = []
    for g in G:
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        rows.append(", ".join("%.9ef" % v for v in p.detach().tolist()))
    print("    {\"%s\"," % name)
    for i, r in enumerate(rows):
        print(("     {{%s}" if i == 0 else "      {%s}") % r + ("}}," if i == len(rows) - 1 else ","))
