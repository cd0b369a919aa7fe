"""envace.cluster"""
