"""fairseq criteria of the plugin (``@register_criterion``): the pre-training and fine-tuning losses."""
