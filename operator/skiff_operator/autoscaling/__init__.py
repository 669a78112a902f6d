"""Autoscaling: the pure decision function, metric scraping, the kopf timer, and HPA/KEDA rendering."""
