"""The loss re-ties shared weights only for a model that shares one, and is right either way."""

import torch
from torch import nn

from fedforge.engine import classification_loss
from fedforge.engine.local import autograd_grad_and_value
from fedforge.models import build_model


class TiedLM(nn.Module):
    """Token embedding and output layer share one weight (as many language models do)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(7, 4)
        self.out = nn.Linear(4, 7, bias=False)
        self.out.weight = self.embedding.weight

    def forward(self, x):
        return self.out(self.embedding(x).mean(1))


def test_only_a_model_with_shared_weights_is_re_tied():
    assert classification_loss(TiedLM()).tied
    assert not classification_loss(build_model("text_classifier", (80,), 2)).tied


def test_tied_weights_get_both_paths_gradients():
    torch.manual_seed(0)
    model = TiedLM()
    params = {k: v.detach() + 0.5 for k, v in model.named_parameters()}  # only "embedding.weight"
    x, y, w = torch.randint(0, 7, (5, 3)), torch.randint(0, 7, (5,)), torch.ones(5)
    grads, loss = autograd_grad_and_value(classification_loss(model))(params, x, y, w)

    with torch.no_grad():
        model.embedding.weight.copy_(params["embedding.weight"])
    ref = nn.functional.cross_entropy(model(x), y)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(grads["embedding.weight"], model.embedding.weight.grad)
