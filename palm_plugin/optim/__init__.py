"""fairseq optimizers of the plugin (``@register_optimizer``)."""
