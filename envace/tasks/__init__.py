"""envace.tasks"""
