"""A full-batch sequence fit in the shape of pytorch/examples/time_sequence_prediction/train.py
(written here): an LSTMCell model, torch.optim.LBFGS stepping with a closure (forward + backward
several times a step) on all 97 training sequences, and after each step a prediction under
torch.no_grad() on 3 test rows."""
import argparse
import itertools

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=15)
p.add_argument("--length", type=int, default=200)
p.add_argument("--sequences", type=int, default=97, help="training sequences (the full batch)")
args = p.parse_args([] if __name__ != "__main__" else None)


def make_data(a):
    torch.manual_seed(0)
    T, L, N = 20, a.length, a.sequences + 3
    x = torch.arange(L).view(1, L) + torch.randint(-4 * T, 4 * T, (N, 1))
    data = torch.sin(x / T).float()
    return data[3:, :-1], data[3:, 1:], data[:3, :-1], data[:3, 1:]  # train, then 3 test rows


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1, self.lstm2 = nn.LSTMCell(1, 51), nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = c_t = torch.zeros(input.size(0), 51)
        h_t2 = c_t2 = torch.zeros(input.size(0), 51)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            outputs += [self.linear(h_t2)]
        for _ in range(future):
            h_t, c_t = self.lstm1(outputs[-1], (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            outputs += [self.linear(h_t2)]
        return torch.cat(outputs, dim=1)


def build():
    seq = Sequence()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)

    def step(inp, target):
        def closure():
            optimizer.zero_grad()
            loss = criterion(seq(inp), target)
            loss.backward()
            return loss
        optimizer.step(closure)

    return seq, criterion, step


def parts(argv):
    """One full batch and one LBFGS step, for a test's independent timing (tests/loop_checks.py)."""
    inp, target, _, _ = make_data(p.parse_args(argv))
    _, _, step = build()
    return itertools.repeat((inp, target)), lambda batch: step(*batch)


if __name__ == "__main__":
    inp, target, test_inp, test_target = make_data(args)
    seq, criterion, step = build()
    for i in range(args.steps):
        step(inp, target)
        with torch.no_grad():  # predict: not part of the training step
            pred = seq(test_inp, future=50)
            criterion(pred[:, :-50], test_target)
