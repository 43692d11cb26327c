"""Building blocks shared by the models: attention masks, relative position bias, the copy layer, layers."""
