"""Servers llmsim is measured against."""
