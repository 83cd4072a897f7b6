"""P-ShareLoRA's reproduction: the bilinear synthetic preference problem of docs/methods/pshare-lora.md §8.1 and its
contextual-bandit policy check, on the method's training code (`methods.pshare_lora`)."""
