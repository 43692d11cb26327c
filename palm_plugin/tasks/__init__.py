"""fairseq tasks of the plugin (``@register_task``): data loading and batching for each objective."""
