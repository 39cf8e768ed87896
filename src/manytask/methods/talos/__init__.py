"""FL + TaLoS (shared/specs/talos_fl.md): Fisher-based sparse masks and the sparse fine-tuning built on them."""

from manytask.methods.talos.mask import calibrate_mask, fisher_diagonal, scored_parameters

__all__ = ["calibrate_mask", "fisher_diagonal", "scored_parameters"]
