"""envace.rollout"""
