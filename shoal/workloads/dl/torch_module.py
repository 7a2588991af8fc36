"""``dl.TorchModule``: placeholder until the torch engine lands."""


class TorchModule:
    def __init__(self, module, seed: int = 0):
        raise NotImplementedError
