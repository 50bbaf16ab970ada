"""smoeweather.metrics"""
