"""Every method a user can train, in one place: `collabalign train`, the deployment configs (`jobs.py`), the CLI
tests and the docs' method table are built from `METHODS`, so a new method is added here once (the demo keeps its own
part per paper). Names only (module paths as strings): reading it loads no method."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Method:
    """A method's entry point `module.train(config, data)` with its config class `module.config`; `data` the example
    file of its data format (`examples.py`: pairs, prompts, labelled or agents); `job` its federated job builder in the
    same module when it deploys on Flower; `node_settings` what a SuperNode may declare about its client (node config
    key -> the config list it sets at the node's index); `paper` the paper it implements or is the baseline of."""

    name: str
    module: str
    config: str
    train: str
    data: str
    paper: str
    job: str | None = None
    node_settings: dict[str, str] = field(default_factory=dict)


METHODS = {m.name: m for m in (
    Method("fedavg-lora", "collabalign.methods.fedavg_lora", "FedAvgLoRAConfig", "train_fedavg_lora", "pairs",
           "the FedAvg-LoRA baseline", job="fedavg_lora_job"),
    Method("pshare-lora", "collabalign.methods.pshare_lora.entry", "PShareLoRAConfig", "train_pshare_lora", "pairs",
           "P-ShareLoRA"),
    Method("pshare-lora-federated", "collabalign.methods.pshare_lora.federated_entry", "FederatedPShareLoRAConfig",
           "train_pshare_lora_federated", "pairs", "P-ShareLoRA", job="pshare_lora_federated_job"),
    Method("meta-reward", "collabalign.methods.meta_reward.entry", "MetaRewardConfig", "train_meta_reward", "pairs",
           "the meta-learned reward model"),
    Method("firm", "collabalign.methods.firm.entry", "FIRMConfig", "train_firm", "prompts", "FIRM", job="firm_job"),
    Method("fslora", "collabalign.methods.fslora.entry", "FSLoRAConfig", "train_fslora", "labelled", "FSLoRA",
           job="fslora_job", node_settings={"rank": "ranks"}),
    Method("affpcl", "collabalign.methods.affpcl.entry", "AffPCLConfig", "train_affpcl", "agents", "AffPCL"),
    Method("affpcl-federated", "collabalign.methods.affpcl.federated_arrays", "FederatedAffPCLConfig",
           "train_affpcl_federated", "agents", "AffPCL", job="affpcl_federated_job"),
    Method("fed-tune", "collabalign.methods.fed_tune", "FedTuneConfig", "train_fed_tune", "pairs",
           "federated SFT / DPO (the baselines of policy alignment)", job="fed_tune_job"),
)}
FEDERATED = {name: m for name, m in METHODS.items() if m.job is not None}  # the methods a deployment config may name


def methods_table() -> str:
    """The Markdown table of every method (docs/architecture.md holds it; tests/test_registry.py keeps it in step)."""
    rows = ["| method | paper | entry point | config | data | federated job |", "|---|---|---|---|---|---|"]
    for m in METHODS.values():
        module = m.module.removeprefix("collabalign.")
        job = f"`{m.job}`" if m.job else "-"
        rows.append(f"| `{m.name}` | {m.paper} | `{module}.{m.train}` | `{m.config}` | {m.data} | {job} |")
    return "\n".join(rows)
