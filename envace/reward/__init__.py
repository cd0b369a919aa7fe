"""envace.reward"""
