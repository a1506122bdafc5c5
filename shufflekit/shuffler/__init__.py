"""Mix nodes of the mixnet shuffler: peel one layer, de-duplicate, batch, permute, forward."""

from shufflekit.shuffler.mix import MixNode, MixOutcome

__all__ = ["MixNode", "MixOutcome"]
