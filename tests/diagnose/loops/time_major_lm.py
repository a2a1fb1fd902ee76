"""A word-level LSTM language model in the shape of pytorch/examples/word_language_model
(written here, on random tokens): batchify to [tokens, batch], get_batch slices [bptt, batch]
(time-major), nn.LSTM with batch_first=False, the hidden state carried between batches, and a
hand-written SGD update (p.data.add_(p.grad, alpha=-lr)): no torch.optim optimizer."""
import argparse
import itertools

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--batch_size", type=int, default=20)
p.add_argument("--bptt", type=int, default=35)
p.add_argument("--tokens", type=int, default=60000)
p.add_argument("--nhid", type=int, default=128)
args = p.parse_args([] if __name__ != "__main__" else None)
torch.manual_seed(0)
ntokens = 1000


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()  # [tokens, batch]


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(ntokens, args.nhid)
        self.rnn = nn.LSTM(args.nhid, args.nhid, 2)  # batch_first=False: [seq, batch, feature]
        self.decoder = nn.Linear(args.nhid, ntokens)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return self.decoder(output).view(-1, ntokens), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(2, bsz, args.nhid), w.new_zeros(2, bsz, args.nhid))


def build():
    model, criterion, lr = RNNModel(), nn.NLLLoss(), 20.0
    model.train()

    def step(data, targets, hidden):
        hidden = tuple(h.detach() for h in hidden)  # repackage_hidden
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output, -1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        return hidden

    return model, step


def parts(argv):
    """Batches of [bptt, batch] and one step, for a test's independent timing."""
    a = p.parse_args(argv)
    source = batchify(torch.randint(0, ntokens, (a.tokens,)), a.batch_size)
    model, step = build()
    hidden = [model.init_hidden(a.batch_size)]

    def one(batch):
        hidden[0] = step(*batch, hidden[0])
    return itertools.cycle([get_batch(source, i) for i in range(0, 8 * a.bptt, a.bptt)]), one


if __name__ == "__main__":
    train_data = batchify(torch.randint(0, ntokens, (args.tokens,)), args.batch_size)
    model, step = build()
    hidden = model.init_hidden(args.batch_size)
    for i in range(0, train_data.size(0) - 1, args.bptt):
        data, targets = get_batch(train_data, i)
        hidden = step(data, targets, hidden)
