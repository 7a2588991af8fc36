"""dl.TorchModule: torch does the layer math under the same plans.  Checked against the numpy
layers (and so the numpy layers against torch, a reference nobody here wrote), and bitwise
across worker counts.  Skipped without torch (pip install 'shoal[torch]', docs/dl.md)."""

from __future__ import annotations

import numpy as np
import pytest
from dl_models import digits, maxdiff, same

import shoal
from shoal.workloads import dl

torch = pytest.importorskip("torch", reason="torch is not installed: pip install 'shoal[torch]' "
                                            "(the CPU wheel, docs/dl.md)")

Xtr, Xte, ytr, yte = digits(240)
PLAN = dl.Plan(replicas=2, stages=2, micro_batches=3)


def torch_cnn(dtype=torch.float64):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               torch.nn.Linear(64, 10)).to(dtype)


def numpy_twin(module: dl.TorchModule) -> dl.Sequential:
    """The dl.Sequential with the TorchModule's parameters (Linear weights transposed)."""
    layers = []
    for layer in module.layers:
        if isinstance(layer, torch.nn.Conv2d):
            layers.append(dl.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                                    stride=layer.stride, padding=layer.padding[0]))
        elif isinstance(layer, torch.nn.Linear):
            layers.append(dl.Linear(layer.in_features, layer.out_features))
        elif isinstance(layer, torch.nn.MaxPool2d):
            layers.append(dl.MaxPool2d(layer.kernel_size))
        else:
            layers.append({torch.nn.ReLU: dl.ReLU, torch.nn.Flatten: dl.Flatten,
                           torch.nn.Tanh: dl.Tanh}[type(layer)]())
    twin = dl.Sequential(layers, dtype=module.dtype)
    twin.set_parameters(to_numpy_layout(module, module.parameters()))
    return twin


def to_numpy_layout(module, params):
    out, k = [], 0
    for layer in module.layers:
        for _ in layer.parameters():
            a = params[k]
            out.append(a.T.copy() if isinstance(layer, torch.nn.Linear) and a.ndim == 2 else a)
            k += 1
    return out


def test_torch_cnn_trains_like_the_numpy_layers():
    X = Xtr.reshape(-1, 1, 8, 8)
    module = dl.TorchModule(torch_cnn())
    twin = numpy_twin(module)
    assert np.allclose(module.forward(X), twin.forward(X), rtol=0, atol=1e-12)
    a = dl.Trainer(module, optimizer=dl.SGD(lr=0.1, momentum=0.9), plan=PLAN)
    a.fit(X, ytr, epochs=2, batch_size=30)
    b = dl.Trainer(twin, optimizer=dl.SGD(lr=0.1, momentum=0.9))
    b.fit(X, ytr, epochs=2, batch_size=30)
    assert maxdiff(to_numpy_layout(module, a.parameters()), b.parameters()) < 1e-10


@pytest.mark.dl_slow  # torch's import in each worker process makes this ~20 s
@pytest.mark.timeout(600)
def test_torch_mlp_bitwise_on_1_and_2_workers():
    def module():
        torch.manual_seed(1)
        return dl.TorchModule(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(),
                                                  torch.nn.Dropout(0.2), torch.nn.Linear(32, 10)))

    X = Xtr.astype(np.float32)
    runs = []
    for workers in (None, 1, 2):
        if workers is None:
            trainer = dl.Trainer(module(), optimizer=dl.Adam(lr=0.01), plan=PLAN)
            trainer.fit(X, ytr, epochs=2, batch_size=30, shuffle=True)
        else:
            with shoal.Pilot(workers=workers) as pilot:
                trainer = dl.Trainer(module(), optimizer=dl.Adam(lr=0.01), plan=PLAN, pilot=pilot)
                trainer.fit(X, ytr, epochs=2, batch_size=30, shuffle=True)
        runs.append(trainer.parameters())
        assert all(p.dtype == np.float32 for p in runs[-1])
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])


def test_torch_shape_error_names_the_layer():
    module = dl.TorchModule(torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(),
                                                torch.nn.Linear(10, 3)))
    with pytest.raises(dl.ShapeError, match=r"layer 2 \(Linear\(in_features=10.*from layer 1 \(ReLU\(\)\)"):
        dl.Trainer(module).fit(Xtr.astype(np.float32), ytr % 3)


def test_torch_dropout_does_not_depend_on_the_cut():
    # regression: masks were keyed by stage, and the measured cut may move a Dropout
    def run(shards):
        torch.manual_seed(1)
        module = dl.TorchModule(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(),
                                                    torch.nn.Dropout(0.2), torch.nn.Linear(32, 10)))
        trainer = dl.Trainer(module, optimizer=dl.SGD(lr=0.1),
                             plan=dl.Plan(replicas=2, micro_batches=3, shards=shards))
        trainer.fit(Xtr.astype(np.float32), ytr, epochs=1, batch_size=30)
        return trainer.parameters()

    assert same(run([[0, 1], [2, 3]]), run([[0, 1, 2], [3]]))
