"""Never reaches a step in time: draws batches and runs forward passes for a long while (an
evaluation before training, say) before the first backward; diagnose must stop it early."""
import torch

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
for _ in range(10**6):  # "evaluation": would run for minutes
    for xb, yb in torch.utils.data.DataLoader(data, batch_size=8):
        with torch.no_grad():
            model(xb)
