"""fairseq models and architectures of the plugin (``@register_model`` / ``@register_model_architecture``)."""
