"""A third-party optimizer that is not a torch.optim.Optimizer subclass (as some research code
and RL libraries carry): diagnose steps on its backward calls."""
import torch


class SignSGD:  # not a torch.optim.Optimizer
    def __init__(self, params, lr):
        self.params, self.lr = list(params), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.sub_(self.lr * p.grad.sign())


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = SignSGD(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
for epoch in range(20):
    for xb, yb in torch.utils.data.DataLoader(data, batch_size=32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
