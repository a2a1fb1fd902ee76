import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import looptune
from looptune.errors import ConfigError
from looptune.recipe import LoaderConfig, OptimConfig, Recipe


def _data(n=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=gen)
    return TensorDataset(x, (x[:, 0] > 0).long())


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


CE = torch.nn.functional.cross_entropy


@pytest.mark.parametrize("strategy,decode", [("dataloader", "per_sample"), ("dataloader", "tensorized"),
                                             ("prefetch", "tensorized"), ("device", "tensorized")])
def test_train_on_a_users_dataset_with_every_strategy(strategy, decode):
    recipe = Recipe(name=strategy, loader=LoaderConfig(strategy=strategy, decode=decode, batch_size=32),
                    optim=OptimConfig(lr=3e-2))
    res = looptune.train(_model(), _data(), recipe=recipe, loss_fn=CE, eval_data=_data(128, 1),
                         device="cpu", epochs=2)
    assert res.epochs == 2 and res.batches_per_epoch == 8 and res.samples_per_epoch == 256
    assert res.test_accuracy is not None and res.test_accuracy > 0.7
    assert res.epoch_loss[1] < res.epoch_loss[0]


def test_every_strategy_trains_the_same_weights():
    weights = []
    for strategy, decode in [("dataloader", "per_sample"), ("prefetch", "tensorized"), ("device", "tensorized")]:
        model = _model()
        recipe = Recipe(name="r", loader=LoaderConfig(strategy=strategy, decode=decode, batch_size=32))
        looptune.train(model, _data(), recipe=recipe, loss_fn=CE, device="cpu", epochs=1)
        weights.append([p.detach().clone() for p in model.parameters()])
    for other in weights[1:]:
        for p, q in zip(weights[0], other):
            torch.testing.assert_close(p, q)


def test_train_with_a_users_dataloader():
    loader = DataLoader(_data(), batch_size=64, shuffle=True)
    res = looptune.train(_model(), loader, recipe="seed-baseline", loss_fn=CE, device="cpu")
    assert res.batches_per_epoch == 4 and res.recipe == "seed-baseline"


def test_dataloader_with_device_strategy_is_refused_with_the_fix():
    with pytest.raises(looptune.ConfigError, match="pass its Dataset instead"):
        looptune.train(_model(), DataLoader(_data()), recipe="device", loss_fn=CE, device="cpu")


def test_bad_arguments_are_all_reported():
    with pytest.raises(looptune.ConfigError) as info:
        looptune.train("not a model", [1, 2, 3], recipe="fastest", loss_fn=None, device="tpu")
    text = str(info.value)
    for needle in ("nn.Module", "loss_fn=None", "unknown recipe 'fastest'", "device='tpu'"):
        assert needle in text


def test_samples_that_are_not_pairs_get_a_clear_error():
    class Singles(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(8)

    with pytest.raises(looptune.ConfigError, match=r"\(input, target\) pairs"):
        looptune.train(_model(), Singles(), recipe="device", loss_fn=CE, device="cpu")


def test_raw_uint8_images_into_a_conv_net_are_refused_before_training_with_the_fix(monkeypatch):
    def forbidden(**_):
        raise AssertionError("trained despite inputs the model cannot take")

    monkeypatch.setattr("looptune.api.run_loop", forbidden)
    images = torch.randint(0, 255, (64, 1, 28, 28), dtype=torch.uint8)
    ds = torch.utils.data.TensorDataset(images, torch.randint(0, 10, (64,)))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Flatten(), torch.nn.LazyLinear(10))
    with pytest.raises(ConfigError, match=r"torch.uint8 \(shape \(1, 28, 28\)\).*torch.float32"
                                          r".*mean=\.\.\., std=\.\.\.") as err:
        looptune.train(model, ds, loss_fn=torch.nn.functional.cross_entropy, device="cpu")
    assert "forward on two samples raised RuntimeError" in str(err.value)
    assert model.training and model[1].num_batches_tracked == 0  # eval mode: BN stats untouched


def test_integer_token_ids_into_an_embedding_model_train():
    tokens = torch.randint(0, 50, (64, 8), dtype=torch.uint8)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(),
                                torch.nn.Linear(128, 4))
    ds = torch.utils.data.TensorDataset(tokens, torch.randint(0, 4, (64,)))

    class Long(torch.nn.Module):  # embeddings want int64: the model converts, as the GPT does
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, x):
            return self.net(x.long())

    res = looptune.train(Long(), ds, loss_fn=torch.nn.functional.cross_entropy, device="cpu")
    assert res.optimizer_steps > 0
