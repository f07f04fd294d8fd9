"""Fitting cost-model efficiencies to measurements."""
