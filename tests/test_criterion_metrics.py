"""What the three criteria log: ``reduce_metrics`` over several workers' logging outputs, as fairseq's trainer calls
it, against the per-token means computed here (base 2, as fairseq logs losses), including the batches where a count
is zero (a worker with a dummy batch, a batch without PAR targets), which must log nothing rather than divide by 0."""
import math

import pytest
import torch
from fairseq import metrics

from palm_plugin.criterions.palm_mlm_lm import PalmMlmLmCriterion
from palm_plugin.criterions.pmlm_ae_par import PseudoMaskedLMCriterion
from palm_plugin.criterions.unilm_cloze import UniLMClozeCriterion

BITS = math.log(2)


def logged(criterion, logging_outputs):
    with metrics.aggregate() as aggregator:
        criterion.reduce_metrics(logging_outputs)
        return aggregator.get_smoothed_values()


def test_palm_losses_are_summed_over_workers_then_divided_by_their_counts():
    workers = [
        {"loss": 2.5, "mlm_loss": 12.0, "mlm_tokens": 5, "lm_loss": 30.0, "ntokens": 11, "sample_size": 1},
        {"loss": 3.5, "mlm_loss": 9.0, "mlm_tokens": 2, "lm_loss": 14.0, "ntokens": 5, "sample_size": 1},
    ]
    values = logged(PalmMlmLmCriterion, workers)
    assert values["loss"] == pytest.approx((2.5 + 3.5) / 2 / BITS, abs=1e-3)
    assert values["mlm_loss"] == pytest.approx(21.0 / 7 / BITS, abs=1e-3)
    assert values["lm_loss"] == pytest.approx(44.0 / 16 / BITS, abs=1e-3)
    assert values["lm_ppl"] == pytest.approx(2 ** values["lm_loss"], rel=1e-3)


def test_palm_stage_ae_logs_no_lm_loss_and_unconditional_no_mlm_loss():
    stage_ae = logged(PalmMlmLmCriterion, [{"loss": 1.0, "mlm_loss": 4.0, "mlm_tokens": 2, "ntokens": 6,
                                            "sample_size": 1}])
    assert stage_ae["mlm_loss"] == pytest.approx(2.0 / BITS, abs=1e-3) and "lm_loss" not in stage_ae
    unconditional = logged(PalmMlmLmCriterion, [{"loss": 1.0, "mlm_loss": 0.0, "mlm_tokens": 0, "lm_loss": 6.0,
                                                 "ntokens": 3, "sample_size": 1}])
    assert "mlm_loss" not in unconditional and unconditional["lm_loss"] == pytest.approx(2.0 / BITS, abs=1e-3)


def test_pseudo_masked_lm_divides_each_loss_by_its_own_count():
    workers = [
        {"loss": 20.0, "ae_loss": 8.0, "ae_count": 4, "par_loss": 12.0, "par_count": 4, "sample_size": 4},
        {"loss": 9.0, "ae_loss": 3.0, "ae_count": 2, "par_loss": 6.0, "par_count": 2, "sample_size": 2},
    ]
    values = logged(PseudoMaskedLMCriterion, workers)
    assert values["loss"] == pytest.approx(29.0 / 6 / BITS, abs=1e-3)
    assert values["ae_loss"] == pytest.approx(11.0 / 6 / BITS, abs=1e-3)
    assert values["par_loss"] == pytest.approx(18.0 / 6 / BITS, abs=1e-3)
    assert values["par_ppl"] == pytest.approx(2 ** values["par_loss"], rel=1e-3)


def test_pseudo_masked_lm_logs_nothing_for_a_count_of_zero():
    ae_only = logged(PseudoMaskedLMCriterion, [{"loss": 6.0, "ae_loss": 6.0, "ae_count": 3, "par_loss": 0.0,
                                                "par_count": 0, "sample_size": 3}])
    assert ae_only["ae_loss"] == pytest.approx(2.0 / BITS, abs=1e-3)
    assert "par_loss" not in ae_only and "par_ppl" not in ae_only
    # fairseq's dummy batch on a worker that ran out of data: no loss to log at all
    assert logged(PseudoMaskedLMCriterion, [{"loss": 0.0, "ae_loss": 0.0, "ae_count": 0, "par_loss": 0.0,
                                             "par_count": 0, "sample_size": 0}]) == {}


def test_cloze_loss_per_predicted_token_and_next_sentence_accuracy():
    workers = [
        {"loss": 3.0, "nll_loss": 2.0, "sample_size": 1, "next_sentence_loss": 1.2, "next_sentence_rows": 2,
         "next_sentence_correct": 1},
        {"loss": 0.0, "nll_loss": 0.0, "sample_size": 0},  # a worker with no prediction: weighs nothing
    ]
    values = logged(UniLMClozeCriterion, workers)
    assert values["loss"] == pytest.approx(3.0 / BITS, abs=1e-3)
    assert values["nll_loss"] == pytest.approx(2.0 / BITS, abs=1e-3)
    assert values["ppl"] == pytest.approx(2 ** values["nll_loss"], rel=1e-3)
    assert values["next_sentence_loss"] == pytest.approx(0.6 / BITS, abs=1e-3)
    assert values["next_sentence_accuracy"] == pytest.approx(0.5, abs=1e-3)
    assert "next_sentence_loss" not in logged(UniLMClozeCriterion, [{"loss": 1.0, "nll_loss": 1.0, "sample_size": 4}])


@pytest.mark.parametrize("criterion, logs, counts", [
    (PalmMlmLmCriterion, {"mlm_loss": "mlm_tokens", "lm_loss": "ntokens"}, {"sample_size": 1}),
    (PseudoMaskedLMCriterion, {"loss": "sample_size", "ae_loss": "ae_count", "par_loss": "par_count"}, {}),
    (UniLMClozeCriterion, {"loss": "sample_size", "nll_loss": "sample_size", "next_sentence_loss": "next_sentence_rows"},
     {}),
])
def test_an_epochs_average_weighs_each_update_by_its_count_and_logs_3_decimals(criterion, logs, counts):
    """fairseq's epoch line (and tensorboard's) averages the per-update values of a meter by their weights: each
    update must weigh its number of predicted tokens, so that the epoch value is the per-token mean of the epoch.
    The values are rounded to 3 decimals, as fairseq's own criteria log them."""
    updates = [{"sample_size": 1}, {"sample_size": 1}]
    for loss, count in logs.items():
        updates[0].update({loss: 1.0, count: 1})  # one token in the first update, seven in the second
        updates[1].update({loss: 21.0, count: 7})
    for update in updates:
        update.update(counts)
    with metrics.aggregate() as epoch:
        for update in updates:
            criterion.reduce_metrics([update])
        values = epoch.get_smoothed_values()
    for loss in logs:
        assert values[loss] == round(22.0 / 8 / BITS, 3), loss


def test_next_sentence_accuracy_is_logged_to_3_decimals():
    values = logged(UniLMClozeCriterion, [{"loss": 1.0, "nll_loss": 1.0, "sample_size": 1, "next_sentence_loss": 1.0,
                                           "next_sentence_rows": 3, "next_sentence_correct": 1}])
    assert values["next_sentence_accuracy"] == 0.333


def test_an_epochs_next_sentence_accuracy_weighs_each_update_by_its_rows():
    """Epoch accuracy = correct rows / rows of the epoch: 1 of 1 then 0 of 3 is 1/4 (not the mean 1/2)."""
    updates = [{"loss": 1.0, "nll_loss": 1.0, "sample_size": 1, "next_sentence_loss": 1.0,
                "next_sentence_rows": rows, "next_sentence_correct": correct} for rows, correct in ((1, 1), (3, 0))]
    with metrics.aggregate() as epoch:
        for update in updates:
            UniLMClozeCriterion.reduce_metrics([update])
        values = epoch.get_smoothed_values()
    assert values["next_sentence_accuracy"] == 0.25


@pytest.mark.parametrize("updates", [1, 3], ids=["one_update", "an_epoch_of_three"])
def test_next_sentence_accuracy_is_the_same_from_a_device_count_as_from_an_int(updates):
    """The forward logs the correct rows as an int, or with --syncs-at-start as the device tensor it summed (not read
    inside the step); one device's trainer hands them to reduce_metrics as they are. 3 of 80 is 0.0375: in double it
    logs 0.037, in float32 (an int64 tensor divided by an int) 0.038. Both ways must log Python's round(3 / 80, 3)."""
    logged_values = []
    for correct in (3, torch.tensor(3)):
        with metrics.aggregate() as epoch:
            for _ in range(updates):
                UniLMClozeCriterion.reduce_metrics([{"loss": 1.0, "nll_loss": 1.0, "sample_size": 1,
                                                     "next_sentence_loss": 1.0, "next_sentence_rows": 80,
                                                     "next_sentence_correct": correct}])
            logged_values.append(epoch.get_smoothed_values()["next_sentence_accuracy"])
    assert logged_values == [round(3 / 80, 3)] * 2 == [0.037] * 2


def test_pseudo_masked_lm_logs_the_loss_of_a_single_prediction():
    values = logged(PseudoMaskedLMCriterion, [{"loss": 3.0, "ae_loss": 1.0, "ae_count": 1, "par_loss": 2.0,
                                               "par_count": 1, "sample_size": 1}])
    assert values["loss"] == pytest.approx(3.0 / BITS, abs=1e-3)


def test_palm_total_loss_is_logged_to_3_decimals():
    assert logged(PalmMlmLmCriterion, [{"loss": 2.5, "sample_size": 1}])["loss"] == round(2.5 / BITS, 3)


@pytest.mark.parametrize("criterion, workers", [
    (PalmMlmLmCriterion, [{"loss": 2.5, "mlm_loss": 12.0, "mlm_tokens": 5, "lm_loss": 30.0, "ntokens": 11,
                           "sample_size": 1},
                          {"loss": 3.5, "mlm_loss": 9.0, "mlm_tokens": 2, "lm_loss": 14.0, "ntokens": 5,
                           "sample_size": 1}]),
    (PseudoMaskedLMCriterion, [{"loss": 3.0, "ae_loss": 1.0, "ae_count": 1, "par_loss": 2.0, "par_count": 1,
                                "sample_size": 2},
                               {"loss": 9.0, "ae_loss": 5.0, "ae_count": 3, "par_loss": 4.0, "par_count": 0,
                                "sample_size": 3}]),
    (UniLMClozeCriterion, [{"loss": 4.0, "nll_loss": 3.0, "sample_size": 3, "next_sentence_loss": 1.2,
                            "next_sentence_rows": 2, "next_sentence_correct": 1},
                           {"loss": 2.0, "nll_loss": 1.5, "sample_size": 1, "next_sentence_loss": 0.4,
                            "next_sentence_rows": 2, "next_sentence_correct": 2}]),
])
def test_summing_the_workers_logs_first_changes_nothing(criterion, workers):
    """``logging_outputs_can_be_summed`` tells fairseq's trainer it may add the workers' logging outputs key by key
    (one all-reduce) before ``reduce_metrics``: true only if that gives what the list gives."""
    summed = {key: sum(worker.get(key, 0) for worker in workers) for key in set().union(*workers)}
    assert criterion.logging_outputs_can_be_summed()
    assert logged(criterion, [summed]) == logged(criterion, workers)
