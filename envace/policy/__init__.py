"""envace.policy"""
