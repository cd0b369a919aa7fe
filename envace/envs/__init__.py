"""envace.envs"""
