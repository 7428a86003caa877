# Generates the expected values of test_nn.c's test_matches_torch with
# PyTorch (run: /usr/bin/python3 tests/data/mlp_reference.py): a
# Sequential(Linear(3, 4), ReLU(), Linear(4, 2)) with fixed parameters,
# CrossEntropyLoss on five samples: the loss, every parameter's gradient in
# state_dict order, and the parameters after two steps of
# SGD(lr=0.1, momentum=0.9, weight_decay=0.01) on the same batch.
import torch

torch.set_printoptions(precision=9)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
vals = {
    "0.weight": [[0.1, -0.2, 0.3], [0.4, 0.5, -0.6], [-0.7, 0.8, 0.9], [0.25, -0.35, 0.45]],
    "0.bias": [0.01, -0.02, 0.03, 0.5],
    "2.weight": [[0.3, -0.1, 0.2, 0.6], [-0.5, 0.4, 0.7, -0.2]],
    "2.bias": [0.05, -0.05],
}
with torch.no_grad():
    for name, p in model.named_parameters():
        p.copy_(torch.tensor(vals[name]))
x = torch.tensor([[1.0, 2.0, -1.0], [0.5, -0.3, 0.8], [-1.2, 0.7, 0.1],
                  [0.3, 0.3, 0.3], [2.0, -1.0, 0.5]])
y = torch.tensor([0, 1, 1, 0, 1])
crit = torch.nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)


def flat(ts):
    return ", ".join("%.9ef" % v for t in ts for v in t.detach().flatten().tolist())


for step in range(2):
    opt.zero_grad()
    loss = crit(model(x), y)
    loss.backward()
    if step == 0:
        print("loss %.9e" % loss.item())
        print("grads {%s}" % flat(p.grad for p in model.parameters()))
    opt.step()
print("params {%s}" % flat(model.parameters()))
